#include "layers/batch_norm.h"

#include <algorithm>
#include <cmath>

#include "engine/base/thread_pool.h"
#include "layers/layer_util.h"

namespace cortado {

void BatchNormLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  eps_ = settings().GetFloat("eps", 1e-5);
  momentum_ = settings().GetFloat("momentum", 0.1);
  affine_ = settings().GetBool("affine", true);
  const bool zero_init = settings().GetBool("zero_init", false);
  has_sync_setting_ = settings().Has("sync");
  sync_setting_ = settings().GetBool("sync", false);
  has_global_setting_ = settings().Has("use_global_stats");
  use_global_stats_ = settings().GetBool("use_global_stats", false);
  if (!(eps_ > 0)) Fail(Describe(), ": key 'eps' must be positive, got ", eps_);
  if (!(momentum_ >= 0 && momentum_ <= 1)) {
    Fail(Describe(), ": key 'momentum' must be in [0, 1], got ", momentum_);
  }
  if (zero_init && !affine_) Fail(Describe(), ": zero_init needs affine: true");
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  if (x.ndim() < 2) {
    Fail(Describe(), ": input '", bottom[0]->name, "' must be (N, C, ...), got ", x.ToString());
  }
  channels_ = x.dim(1);
  if (affine_) {
    AddParam("weight", {channels_}, x.dtype(), ParamKind::kNorm).value.Fill(zero_init ? 0.0 : 1.0);
    AddParam("bias", {channels_}, x.dtype(), ParamKind::kNorm);
  }
  AddBuffer("running_mean", {channels_}, x.dtype());
  AddBuffer("running_var", {channels_}, x.dtype()).value.Fill(1.0);
  mean_.assign(channels_, 0.0);
  invstd_.assign(channels_, 1.0);
}

BatchStatsReducer* BatchNormLayer::Reducer() const {
  const bool sync = has_sync_setting_ ? sync_setting_ : context().sync_batch_norm;
  return sync ? context().batch_stats : nullptr;
}

bool BatchNormLayer::UseGlobalStats() const {
  return has_global_setting_ ? use_global_stats_ : phase() == Phase::kTest;
}

void BatchNormLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& x = bottom[0]->data;
  CheckFloatInput(*this, x, "input");
  CheckParamDType(*this, MasterDType(x.dtype()));
  if (x.ndim() < 2 || x.dim(1) != channels_) {
    Fail(Describe(), ": input '", bottom[0]->name, "' must be (N, ", channels_, ", ...), got ",
         x.ToString());
  }
  if (buffers_[0].value.dtype() != MasterDType(x.dtype())) {
    Fail(Describe(), ": running statistics are ", DTypeName(buffers_[0].value.dtype()),
         " but the input is ", x.ToString());
  }
  num_ = x.dim(0);
  spatial_ = ShapeCount(x.shape(), 2, x.ndim());
  top[0]->data.Resize(x.shape(), x.dtype());
}

template <typename S>
void BatchNormLayer::ForwardT(const Tensor& xt, Tensor& yt) {
  using T = Compute<S>;
  const int64_t c_n = channels_, n = num_, s = spatial_;
  const S* x = xt.data<S>();  // bottom: (N, C, S)
  S* y = yt.data<S>();        // top: (N, C, S)
  T* running_mean = buffers_[0].value.data<T>();
  T* running_var = buffers_[1].value.data<T>();
  const T* gamma = affine_ ? params_[0].value.data<T>() : nullptr;
  const T* beta = affine_ ? params_[1].value.data<T>() : nullptr;
  last_used_batch_stats_ = !UseGlobalStats();

  if (last_used_batch_stats_) {
    // Per channel: sum x and sum x^2, accumulated in double (as PyTorch's CPU kernels do), so
    // that var = E[x^2] - E[x]^2 does not cancel when |mean| >> std.
    std::vector<double> s1(c_n), s2(c_n);
    ParallelFor(c_n, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double a1 = 0, a2 = 0;
        for (int64_t i = 0; i < n; ++i) {
          const S* plane = x + (i * c_n + c) * s;
#pragma omp simd reduction(+ : a1, a2)
          for (int64_t j = 0; j < s; ++j) {
            const double v = Widen(plane[j]);
            a1 += v;
            a2 += v * v;
          }
        }
        s1[c] = a1;
        s2[c] = a2;
      }
    });
    double count = static_cast<double>(n * s);
    BatchStatsReducer* reducer = Reducer();
    if (reducer != nullptr) {
      // One call for [sum x, sum x^2, count]: the count makes unequal per-rank batches weigh
      // by their size.
      reduce_buf_.resize(2 * c_n + 1);
      std::copy(s1.begin(), s1.end(), reduce_buf_.begin());
      std::copy(s2.begin(), s2.end(), reduce_buf_.begin() + c_n);
      reduce_buf_[2 * c_n] = count;
      reducer->AllReduceSum(reduce_buf_.data(), 2 * c_n + 1);
      std::copy(reduce_buf_.begin(), reduce_buf_.begin() + c_n, s1.begin());
      std::copy(reduce_buf_.begin() + c_n, reduce_buf_.begin() + 2 * c_n, s2.begin());
      count = reduce_buf_[2 * c_n];
    }
    if (count <= 1) {
      Fail(Describe(), ": training needs more than one value per channel, got input ",
           xt.ToString(), reducer != nullptr ? " (across the batch-norm group's ranks)" : "");
    }
    count_ = count;
    for (int64_t c = 0; c < c_n; ++c) {
      mean_[c] = s1[c] / count;
      const double var = std::max(0.0, s2[c] / count - mean_[c] * mean_[c]);
      invstd_[c] = 1.0 / std::sqrt(var + eps_);
      const double m = momentum_;
      running_mean[c] = static_cast<T>((1 - m) * running_mean[c] + m * mean_[c]);
      running_var[c] = static_cast<T>((1 - m) * running_var[c] + m * var * count / (count - 1));
    }
  } else {
    for (int64_t c = 0; c < c_n; ++c) {
      mean_[c] = running_mean[c];
      invstd_[c] = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps_);
    }
  }

  // y = a (x - mean) + beta per channel, with a = gamma invstd. (Subtracting the mean first
  // avoids the cancellation of a x + (beta - a mean) when |mean| >> std.)
  ParallelFor(n * c_n, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t plane = p0; plane < p1; ++plane) {
      const int64_t c = plane % c_n;
      const double g = gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0;
      const T a = static_cast<T>(g * invstd_[c]);
      const T m = static_cast<T>(mean_[c]);
      const T b = beta != nullptr ? beta[c] : T(0);
      const S* src = x + plane * s;
      S* dst = y + plane * s;
      for (int64_t j = 0; j < s; ++j) dst[j] = Narrow<S>(a * (Widen(src[j]) - m) + b);
    }
  });
}

template <typename S>
void BatchNormLayer::BackwardT(const Tensor& xt, const Tensor& dyt, bool propagate, Tensor* dxt) {
  using T = Compute<S>;
  const int64_t c_n = channels_, n = num_, s = spatial_;
  const S* x = xt.data<S>();    // bottom: (N, C, S)
  const S* dy = dyt.data<S>();  // top grad: (N, C, S)
  const T* gamma = affine_ ? params_[0].value.data<T>() : nullptr;

  // Per channel: sum dy and sum dy * (x - mean).
  std::vector<double> sdy(c_n), sdyx(c_n);
  ParallelFor(c_n, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const T mean = static_cast<T>(mean_[c]);
      double a1 = 0, a2 = 0;
      for (int64_t i = 0; i < n; ++i) {
        const S* xp = x + (i * c_n + c) * s;
        const S* gp = dy + (i * c_n + c) * s;
#pragma omp simd reduction(+ : a1, a2)
        for (int64_t j = 0; j < s; ++j) {
          const double g = Widen(gp[j]);
          a1 += g;
          a2 += g * static_cast<double>(Widen(xp[j]) - mean);
        }
      }
      sdy[c] = a1;
      sdyx[c] = a2;
    }
  });
  // Param grads are local: dgamma = sum dy * xhat, dbeta = sum dy.
  if (affine_) {
    T* dgamma = params_[0].grad.data<T>();
    T* dbeta = params_[1].grad.data<T>();
    for (int64_t c = 0; c < c_n; ++c) {
      dgamma[c] = static_cast<T>(sdyx[c] * invstd_[c]);
      dbeta[c] = static_cast<T>(sdy[c]);
    }
  }
  if (!propagate) return;

  // dx = A dy + B (x - mean) + C per channel.
  std::vector<double> coef_a(c_n), coef_b(c_n), coef_c(c_n);
  if (last_used_batch_stats_) {
    // dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)), means over the global batch.
    double count = count_;
    if (BatchStatsReducer* reducer = Reducer()) {
      reduce_buf_.resize(2 * c_n);
      std::copy(sdy.begin(), sdy.end(), reduce_buf_.begin());
      std::copy(sdyx.begin(), sdyx.end(), reduce_buf_.begin() + c_n);  // sum dy * (x - mean)
      reducer->AllReduceSum(reduce_buf_.data(), 2 * c_n);
      std::copy(reduce_buf_.begin(), reduce_buf_.begin() + c_n, sdy.begin());
      std::copy(reduce_buf_.begin() + c_n, reduce_buf_.end(), sdyx.begin());
    }
    for (int64_t c = 0; c < c_n; ++c) {
      const double g = gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0;
      const double a = g * invstd_[c];
      const double b = -a * invstd_[c] * invstd_[c] * sdyx[c] / count;
      coef_a[c] = a;
      coef_b[c] = b;
      coef_c[c] = -a * sdy[c] / count;
    }
  } else {
    for (int64_t c = 0; c < c_n; ++c) {
      const double g = gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0;
      coef_a[c] = g * invstd_[c];
      coef_b[c] = 0;
      coef_c[c] = 0;
    }
  }
  S* dx = dxt->data<S>();  // bottom grad: (N, C, S)
  ParallelFor(n * c_n, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t plane = p0; plane < p1; ++plane) {
      const int64_t c = plane % c_n;
      const T a = static_cast<T>(coef_a[c]), b = static_cast<T>(coef_b[c]),
              cc = static_cast<T>(coef_c[c]), m = static_cast<T>(mean_[c]);
      const S* gp = dy + plane * s;
      const S* xp = x + plane * s;
      S* dp = dx + plane * s;
      for (int64_t j = 0; j < s; ++j) {
        dp[j] = Narrow<S>(a * Widen(gp[j]) + b * (Widen(xp[j]) - m) + cc);
      }
    }
  });
}

template class TypedLayer<BatchNormLayer, AllFloatTypes, KernelArgs::kOneInput>;

CORTADO_REGISTER_LAYER(BatchNorm, BatchNormLayer);

}  // namespace cortado
