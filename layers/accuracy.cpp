#include "layers/accuracy.h"

#include <cmath>

#include "engine/tensor/indexed_launch.h"
#include "layers/device_staging.h"
#include "layers/layer_util.h"
#include "layers/loss_kernels.h"

namespace cortado {

void AccuracyLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  top_k_ = settings().GetInt("top_k", 1);
  if (top_k_ < 1) Fail(Describe(), ": key 'top_k' must be at least 1, got ", top_k_);
}

void AccuracyLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& x = bottom[0]->data;
  const Tensor& label = bottom[1]->data;
  CheckFloatInput(*this, x, "scores (input 0)");
  bool ok = x.ndim() >= 2;
  for (int d = 2; ok && d < x.ndim(); ++d) ok = x.dim(d) == 1;
  if (!ok) Fail(Describe(), ": scores '", bottom[0]->name, "' must be (N, C), got ", x.ToString());
  if (label.dtype() != DType::kI32) {
    Fail(Describe(), ": label '", bottom[1]->name, "' must be i32, got ", label.ToString());
  }
  const bool label_ok = (label.ndim() == 1 && label.dim(0) == x.dim(0)) ||
                        (label.ndim() == 2 && label.dim(0) == x.dim(0) && label.dim(1) == 1);
  if (!label_ok) {
    Fail(Describe(), ": label '", bottom[1]->name, "' must be (", x.dim(0), ") to match scores ",
         x.ToString(), ", got ", label.ToString());
  }
  top[0]->data.Resize({}, MasterDType(x.dtype()));  // a fraction, in f32 for bf16/f16
  hit_.Resize({x.dim(0)}, DType::kI32);
}

void AccuracyLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  const Tensor& scores = bottom[0]->data;
  // bf16/f16: the scores widened on the device, as the CPU's ForwardInF32 widens them.
  const Tensor& x = IsLowPrecision(scores.dtype()) ? WidenedF32(scores, wide_) : scores;
  KeepOn(hit_, x.device());  // the flags are the device path's alone
  const Tensor& label = bottom[1]->data;
  Tensor& accuracy = top[0]->data;
  const int64_t n = x.dim(0);
  const std::string what = Describe() + " forward";
  DispatchFloat(x.dtype(), what, [&](auto zero) {
    using T = decltype(zero);
    RunIndexed(what.c_str(), {x, label, hit_}, n,
               kernels::AccuracyRows<T>{x.device_data<T>(), label.device_data<int32_t>(),
                                        hit_.device_data<int32_t>(), x.dim(1), top_k_},
               16);
    RunIndexed(
        what.c_str(), {hit_, accuracy}, 1,
        kernels::AccuracyOfRows<T>{hit_.device_data<int32_t>(), accuracy.device_data<T>(), n});
  });
}

template <typename T>
void AccuracyLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  const Tensor& xt = bottom[0]->data;
  const int64_t n = xt.dim(0), c_n = xt.dim(1);
  const T* x = xt.data<T>();                               // bottom[0]: (N, C)
  const int32_t* label = bottom[1]->data.data<int32_t>();  // bottom[1]: (N)
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t y = label[i];
    if (y < 0 || y >= c_n) {
      Fail(Describe(), ": label ", y, " of sample ", i, " is out of range [0, ", c_n, ")");
    }
    const T* xi = x + i * c_n;
    const T target = xi[y];
    if (std::isnan(target)) continue;
    int64_t better = 0;  // other classes scoring >= the label's score
    for (int64_t c = 0; c < c_n; ++c) better += (c != y && xi[c] >= target) ? 1 : 0;
    if (better < top_k_) ++correct;
  }
  top[0]->data.data<T>()[0] =
      static_cast<T>(n > 0 ? static_cast<double>(correct) / static_cast<double>(n) : 0.0);
}

template <typename T>
void AccuracyLayer::BackwardT(const Blobs&, const std::vector<bool>&, const Blobs&) {}

template class TypedLayer<AccuracyLayer, WideFloatTypes>;

CORTADO_REGISTER_LAYER(Accuracy, AccuracyLayer);

}  // namespace cortado
