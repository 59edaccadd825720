#include "layers/dropout.h"

#include <algorithm>

#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/device_staging.h"
#include "layers/dropout_kernels.h"
#include "layers/layer_util.h"

namespace cortado {

namespace {

constexpr int64_t kDropoutChunk = 8192;

template <typename T>
void MaskKernel(const uint8_t* __restrict mask, T scale, const T* __restrict in, T* __restrict out,
                int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = in[i] * scale;
    out[i] = mask[i] ? v : T(0);
  }
}

}  // namespace

void DropoutLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  ratio_ = settings().GetFloat("ratio", 0.5);
  if (!(ratio_ >= 0.0 && ratio_ < 1.0)) {
    Fail(Describe(), ": key 'ratio' must be in [0, 1), got ", ratio_);
  }
}

void DropoutLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  CheckFloatInput(*this, bottom[0]->data, "input");
  top[0]->data.Resize(bottom[0]->data.shape(), bottom[0]->data.dtype());
  top[0]->data.set_format(bottom[0]->data.format());
  mask_.Resize(bottom[0]->data.shape(), DType::kU8);
}

void DropoutLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  const Tensor& in = bottom[0]->data;
  Tensor& out = top[0]->data;
  last_forward_train_ = phase() == Phase::kTrain && ratio_ > 0.0;
  // bf16/f16: widened on the device into f32, computed there in place (each element reads its
  // own before writing it) and rounded back, as the CPU's ForwardInF32 computes them.
  const bool low = IsLowPrecision(in.dtype());
  const Tensor& x = low ? WidenedF32(in, wide_) : in;
  Tensor& y = low ? wide_ : out;
  const int64_t n = x.numel();
  const std::string what = Describe() + " forward";
  DispatchFloat(x.dtype(), what, [&](auto zero) {
    using T = decltype(zero);
    if (!last_forward_train_) {
      RunIndexed(what.c_str(), {x, y}, n,
                 kernels::CopyElements<T>{x.device_data<T>(), y.device_data<T>()}, 32768);
      return;
    }
    KeepOn(mask_, x.device());
    // The CPU kernel's draw (ForwardT): the same key, the same global element indices.
    const int64_t samples = std::max<int64_t>(1, x.ndim() > 0 ? x.dim(0) : 1);
    const int64_t per_sample = n / samples;
    const bool nhwc = x.channels_last() && !x.IsLayoutTrivial();
    const int64_t channels = nhwc ? x.dim(1) : 1;
    kernels::DropoutForward<T> body{x.device_data<T>(),
                                    y.device_data<T>(),
                                    mask_.device_data<uint8_t>(),
                                    HashCombine(HashCombine(context().seed, HashString(name())),
                                                static_cast<uint64_t>(context().iteration)),
                                    ratio_,
                                    static_cast<T>(1.0 / (1.0 - ratio_)),
                                    per_sample,
                                    context().sample_base,
                                    context().sample_stride,
                                    channels,
                                    nhwc ? per_sample / channels : 1};
    RunIndexed(what.c_str(), {x, y, mask_}, n, body, kDropoutChunk);
  });
  if (low) out.ConvertFrom(y);
}

void DropoutLayer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                    const Blobs& bottom) {
  if (!propagate_down[0]) return;
  Tensor& grad = bottom[0]->grad;
  // bf16/f16: as forward, in place on the gradient widened on the device.
  const bool low = IsLowPrecision(grad.dtype());
  const Tensor& dy = low ? WidenedF32(top[0]->grad, wide_) : top[0]->grad;
  Tensor& dx = low ? wide_ : grad;
  const int64_t n = dy.numel();
  const std::string what = Describe() + " backward";
  DispatchFloat(dy.dtype(), what, [&](auto zero) {
    using T = decltype(zero);
    if (!last_forward_train_) {
      RunIndexed(what.c_str(), {dy, dx}, n,
                 kernels::CopyElements<T>{dy.device_data<T>(), dx.device_data<T>()}, 32768);
      return;
    }
    RunIndexed(
        what.c_str(), {mask_, dy, dx}, n,
        kernels::DropoutBackward<T>{mask_.device_data<uint8_t>(), dy.device_data<T>(),
                                    dx.device_data<T>(), static_cast<T>(1.0 / (1.0 - ratio_))},
        32768);
  });
  if (low) grad.ConvertFrom(dx);
}

template <typename T>
void DropoutLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  last_forward_train_ = phase() == Phase::kTrain && ratio_ > 0.0;
  const T* x = bottom[0]->data.data<T>();  // bottom: any shape
  T* y = top[0]->data.data<T>();           // top: same shape
  const int64_t n = bottom[0]->data.numel();
  if (!last_forward_train_) {
    ParallelFor(n, 32768, [&](int64_t b, int64_t e) { std::copy(x + b, x + e, y + b); });
    return;
  }
  const uint64_t base = HashCombine(HashCombine(context().seed, HashString(name())),
                                    static_cast<uint64_t>(context().iteration));
  const T scale = static_cast<T>(1.0 / (1.0 - ratio_));
  const double ratio = ratio_;
  KeepOn(mask_, Device::CPU());
  uint8_t* mask = mask_.data<uint8_t>();
  // Element f of local sample j is element f of global sample sample_base + j * stride, so
  // W ranks draw the masks one process draws for the combined batch.
  const int64_t samples =
      std::max<int64_t>(1, bottom[0]->data.ndim() > 0 ? bottom[0]->data.dim(0) : 1);
  const int64_t per_sample = n / samples;
  const int64_t sample_base = context().sample_base, stride = context().sample_stride;
  // Channels-last: memory element f = (h W + w) C + c of a sample is logical c H W + h W + w.
  const bool nhwc = bottom[0]->data.channels_last() && !bottom[0]->data.IsLayoutTrivial();
  const int64_t channels = nhwc ? bottom[0]->data.dim(1) : 1;
  const int64_t plane = nhwc ? per_sample / channels : 1;
  ParallelFor(n, kDropoutChunk, [&](int64_t begin, int64_t end) {
    int64_t j = per_sample > 0 ? begin / per_sample : 0;
    int64_t f = begin - j * per_sample;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t logical = nhwc ? (f % channels) * plane + f / channels : f;
      const int64_t global = (sample_base + j * stride) * per_sample + logical;
      mask[i] = KeyToUniform(HashCombine(base, static_cast<uint64_t>(global))) >= ratio ? 1 : 0;
      if (++f == per_sample) {
        f = 0;
        ++j;
      }
    }
    MaskKernel(mask + begin, scale, x + begin, y + begin, end - begin);
  });
}

template <typename T>
void DropoutLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                             const Blobs& bottom) {
  if (!propagate_down[0]) return;
  const T* dy = top[0]->grad.data<T>();
  T* dx = bottom[0]->grad.data<T>();
  const int64_t n = bottom[0]->data.numel();
  if (!last_forward_train_) {
    ParallelFor(n, 32768, [&](int64_t b, int64_t e) { std::copy(dy + b, dy + e, dx + b); });
    return;
  }
  const T scale = static_cast<T>(1.0 / (1.0 - ratio_));
  const uint8_t* mask = mask_.data<uint8_t>();
  ParallelFor(n, 32768, [&](int64_t begin, int64_t end) {
    MaskKernel(mask + begin, scale, dy + begin, dx + begin, end - begin);
  });
}

template class TypedLayer<DropoutLayer, WideFloatTypes>;

CORTADO_REGISTER_LAYER(Dropout, DropoutLayer);

}  // namespace cortado
