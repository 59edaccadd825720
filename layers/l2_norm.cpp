#include "layers/l2_norm.h"

#include <algorithm>
#include <cmath>

#include "engine/base/thread_pool.h"
#include "layers/layer_util.h"

namespace cortado {

void L2NormLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  if (x.ndim() < 2)
    Fail(Describe(), ": input '", bottom[0]->name, "' must be (N, C, ...), got ", x.ToString());
  const double scale = settings().GetFloat("scale_init", 20.0);
  eps_ = settings().GetFloat("eps", 1e-12);
  if (!(eps_ > 0)) Fail(Describe(), ": key 'eps' must be positive, got ", eps_);
  Param& w = AddParam("weight", {x.dim(1)}, x.dtype(), ParamKind::kWeight);
  w.value.Fill(scale);
}

void L2NormLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  if (x.ndim() < 2 || x.dim(1) != params_[0].value.dim(0)) {
    Fail(Describe(), ": input '", bottom[0]->name, "' must be (N, ", params_[0].value.dim(0),
         ", ...), got ", x.ToString());
  }
  num_ = x.dim(0);
  channels_ = x.dim(1);
  spatial_ = ShapeCount(x.shape(), 2, x.ndim());
  inv_norm_.resize(static_cast<size_t>(num_ * spatial_));
  top[0]->data.Resize(x.shape(), x.dtype());
}

namespace {

// Runs fn(n, s0, s1) over the positions [begin, end) of the flattened (N, S) grid, cut where an
// image ends, so each call covers positions of one image.
template <typename Fn>
void ForPositions(int64_t begin, int64_t end, int64_t spatial, Fn&& fn) {
  constexpr int64_t kRun = 256;  // positions per call: the f64 sums stay in L1
  for (int64_t p = begin; p < end;) {
    const int64_t n = p / spatial, s0 = p % spatial;
    const int64_t s1 = std::min({spatial, s0 + kRun, s0 + (end - p)});
    fn(n, s0, s1);
    p += s1 - s0;
  }
}

// Thread t's static range of [0, total).
std::pair<int64_t, int64_t> TaskRange(int64_t total, int tasks, int t) {
  return {total * t / tasks, total * (t + 1) / tasks};
}

}  // namespace

template <typename T>
void L2NormLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  CheckParamDType(*this, bottom[0]->data.dtype());
  const T* x = bottom[0]->data.data<T>();  // (N, C, S)
  T* y = top[0]->data.data<T>();           // (N, C, S)
  const T* w = params_[0].value.data<T>();
  const int64_t c_n = channels_, s_n = spatial_;
  const int tasks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(NumThreads(), (num_ * s_n + 1023) / 1024)));
  ParallelTasks(tasks, [&](int t) {
    const auto [begin, end] = TaskRange(num_ * s_n, tasks, t);
    std::vector<double> sum;
    ForPositions(begin, end, s_n, [&](int64_t n, int64_t s0, int64_t s1) {
      const int64_t len = s1 - s0;
      sum.assign(static_cast<size_t>(len), 0.0);
      const T* xn = x + n * c_n * s_n + s0;
      T* yn = y + n * c_n * s_n + s0;
      for (int64_t c = 0; c < c_n; ++c) {
        const T* xc = xn + c * s_n;
        for (int64_t j = 0; j < len; ++j) sum[j] += static_cast<double>(xc[j]) * xc[j];
      }
      double* inv = inv_norm_.data() + n * s_n + s0;
      for (int64_t j = 0; j < len; ++j) inv[j] = 1.0 / std::max(std::sqrt(sum[j]), eps_);
      for (int64_t c = 0; c < c_n; ++c) {
        const T* xc = xn + c * s_n;
        T* yc = yn + c * s_n;
        const double wc = w[c];
        for (int64_t j = 0; j < len; ++j) yc[j] = static_cast<T>(wc * xc[j] * inv[j]);
      }
    });
  });
}

template <typename T>
void L2NormLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                            const Blobs& bottom) {
  const T* x = bottom[0]->data.data<T>();  // (N, C, S)
  const T* dy = top[0]->grad.data<T>();    // (N, C, S)
  T* dx = propagate_down[0] ? bottom[0]->grad.data<T>() : nullptr;
  const T* w = params_[0].value.data<T>();
  const int64_t c_n = channels_, s_n = spatial_;
  const bool param_grad = params_[0].grad.defined();
  const int tasks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(NumThreads(), (num_ * s_n + 1023) / 1024)));
  std::vector<std::vector<double>> dw_parts(static_cast<size_t>(tasks),
                                            std::vector<double>(static_cast<size_t>(c_n), 0.0));
  ParallelTasks(tasks, [&](int t) {
    const auto [begin, end] = TaskRange(num_ * s_n, tasks, t);
    std::vector<double>& dw = dw_parts[static_cast<size_t>(t)];
    std::vector<double> dot;
    ForPositions(begin, end, s_n, [&](int64_t n, int64_t s0, int64_t s1) {
      const int64_t len = s1 - s0;
      const int64_t base = n * c_n * s_n + s0;
      const double* inv = inv_norm_.data() + n * s_n + s0;
      // dot[j] = sum_c weight[c] dy[c] x[c] at position j; dweight[c] += dy x / r.
      dot.assign(static_cast<size_t>(len), 0.0);
      for (int64_t c = 0; c < c_n; ++c) {
        const T* xc = x + base + c * s_n;
        const T* dyc = dy + base + c * s_n;
        double part = 0;
        for (int64_t j = 0; j < len; ++j) {
          const double p = static_cast<double>(dyc[j]) * xc[j];
          dot[j] += w[c] * p;
          part += p * inv[j];
        }
        dw[c] += part;
      }
      if (dx == nullptr) return;
      // At r = eps the norm is clamped: r is a constant there and the second term vanishes.
      for (int64_t j = 0; j < len; ++j) {
        dot[j] = inv[j] < 1.0 / eps_ ? dot[j] * inv[j] * inv[j] * inv[j] : 0.0;
      }
      for (int64_t c = 0; c < c_n; ++c) {
        const T* xc = x + base + c * s_n;
        const T* dyc = dy + base + c * s_n;
        T* dxc = dx + base + c * s_n;
        const double wc = w[c];
        for (int64_t j = 0; j < len; ++j) {
          dxc[j] = static_cast<T>(wc * dyc[j] * inv[j] - xc[j] * dot[j]);
        }
      }
    });
  });
  if (!param_grad) return;
  T* dw = params_[0].grad.data<T>();
  for (int64_t c = 0; c < c_n; ++c) {
    double total = 0;
    for (int t = 0; t < tasks; ++t) total += dw_parts[static_cast<size_t>(t)][c];
    dw[c] = static_cast<T>(total);
  }
}

template class TypedLayer<L2NormLayer, WideFloatTypes>;

CORTADO_REGISTER_LAYER(L2Norm, L2NormLayer);

}  // namespace cortado
