#include "layers/relu.h"

#include "engine/base/thread_pool.h"
#include "engine/tensor/device_kernels.h"
#include "engine/tensor/indexed_launch.h"
#include "layers/eltwise_kernels.h"
#include "layers/layer_util.h"

namespace cortado {

// Elements per task: below this the hand-off to the pool costs more than it saves.
constexpr int64_t kReluChunk = 32768;

namespace {

// Kernels on restrict pointers with unconditional loads, so that the selects vectorize
// (the same loops over pointers captured by a lambda do not). The slope-0 forms keep
// ReLU(-inf) = 0 exact.
template <typename T>
void ReluForwardKernel(const T* __restrict x, T* __restrict y, int64_t n, T slope) {
  if (slope == T(0)) {
    for (int64_t i = 0; i < n; ++i) {
      const T v = x[i];
      y[i] = v > T(0) ? v : T(0);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T v = x[i];
      y[i] = v > T(0) ? v : slope * v;
    }
  }
}

// In place: the input is overwritten by the output.
template <typename T>
void ReluInPlaceKernel(T* __restrict y, int64_t n, T slope) {
  if (slope == T(0)) {
    for (int64_t i = 0; i < n; ++i) {
      const T v = y[i];
      y[i] = v > T(0) ? v : T(0);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T v = y[i];
      y[i] = v > T(0) ? v : slope * v;
    }
  }
}

template <typename T>
void ReluBackwardKernel(const T* __restrict x, const T* __restrict dy, T* __restrict dx, int64_t n,
                        T slope) {
  if (slope == T(0)) {
    for (int64_t i = 0; i < n; ++i) {
      const T g = dy[i];
      dx[i] = x[i] > T(0) ? g : T(0);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T g = dy[i];
      dx[i] = x[i] > T(0) ? g : slope * g;
    }
  }
}
// bf16 and f16 share IEEE's sign-magnitude layout, so ReLU (slope 0) runs on the 16-bit codes:
// x > 0 exactly when 0 < code <= the code of +inf (NaN codes lie above it and go to 0, as the
// f32 comparison sends them).
void Relu16Forward(const uint16_t* __restrict x, uint16_t* __restrict y, int64_t n, uint16_t inf) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = x[i];
    y[i] = (v != 0 && v <= inf) ? v : uint16_t{0};
  }
}
void Relu16Backward(const uint16_t* __restrict y, const uint16_t* __restrict dy,
                    uint16_t* __restrict dx, int64_t n, uint16_t inf) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = y[i];
    dx[i] = (v != 0 && v <= inf) ? dy[i] : uint16_t{0};
  }
}
}  // namespace

void ReluLayer::Forward16(const Blobs& bottom, const Blobs& top, uint16_t inf) {
  if (negative_slope_ != 0) return ForwardInF32(bottom, top);
  if (in_place_) top[0]->data = bottom[0]->data;
  const auto* x = static_cast<const uint16_t*>(bottom[0]->data.raw_data());
  auto* y = static_cast<uint16_t*>(top[0]->data.raw_data());
  ParallelFor(bottom[0]->data.numel(), kReluChunk, [&](int64_t begin, int64_t end) {
    Relu16Forward(x + begin, y + begin, end - begin, inf);
  });
}

void ReluLayer::Backward16(const Blobs& top, const std::vector<bool>& propagate_down,
                           const Blobs& bottom, uint16_t inf) {
  if (negative_slope_ != 0) return BackwardInF32(top, propagate_down, bottom);
  if (!propagate_down[0]) return;
  const auto* y = static_cast<const uint16_t*>(top[0]->data.raw_data());
  const auto* dy = static_cast<const uint16_t*>(top[0]->grad.raw_data());
  auto* dx = static_cast<uint16_t*>(bottom[0]->grad.raw_data());
  ParallelFor(bottom[0]->data.numel(), kReluChunk, [&](int64_t begin, int64_t end) {
    Relu16Backward(y + begin, dy + begin, dx + begin, end - begin, inf);
  });
}

void ReluLayer::ForwardOnDevice(const Blobs& bottom, const Blobs& top) {
  if (in_place_) top[0]->data = bottom[0]->data;
  const Tensor& x = bottom[0]->data;
  Tensor& y = top[0]->data;
  if (!IsLowPrecision(x.dtype())) return DeviceReluForward(x, y, negative_slope_);
  // 16-bit: widened, compared (and scaled) in f32, rounded once: the CPU's codes (slope 0) and
  // its f32 fallback (a slope) give exactly that.
  WithElementCodes(*this, x.dtype(), [&](auto codes) {
    using E = decltype(codes);
    kernels::ReluForwardCodes<E> body;
    body.x = StoredData<E>(x);
    body.y = StoredData<E>(y);
    body.slope = static_cast<typename E::Acc>(negative_slope_);
    RunIndexed("ReLU forward", {x, y}, x.numel(), body, kReluChunk);
  });
}

void ReluLayer::BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                                 const Blobs& bottom) {
  if (!propagate_down[0]) return;
  // The mask as on the CPU: y's sign is x's unless the slope is negative.
  const Tensor& mask = negative_slope_ >= 0 ? top[0]->data : bottom[0]->data;
  const Tensor& dy = top[0]->grad;
  Tensor& dx = bottom[0]->grad;
  if (!IsLowPrecision(mask.dtype())) return DeviceReluBackward(mask, dy, dx, negative_slope_);
  WithElementCodes(*this, mask.dtype(), [&](auto codes) {
    using E = decltype(codes);
    kernels::ReluBackwardCodes<E> body;
    body.mask = StoredData<E>(mask);
    body.dy = StoredData<E>(dy);
    body.dx = StoredData<E>(dx);
    body.slope = static_cast<typename E::Acc>(negative_slope_);
    RunIndexed("ReLU backward", {mask, dy, dx}, mask.numel(), body, kReluChunk);
  });
}

void ReluLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  negative_slope_ = settings().GetFloat("negative_slope", 0.0);
}

void ReluLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  CheckFloatInput(*this, bottom[0]->data, "input");
  if (in_place_) {
    top[0]->data = bottom[0]->data;  // the same storage
  } else {
    top[0]->data.Resize(bottom[0]->data.shape(), bottom[0]->data.dtype());
    top[0]->data.set_format(bottom[0]->data.format());
  }
}

template <typename T>
void ReluLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  const T slope = static_cast<T>(negative_slope_);
  if (in_place_) {
    // The bottom may have been reallocated since Reshape (a larger batch); share again.
    top[0]->data = bottom[0]->data;
    T* y = top[0]->data.data<T>();
    ParallelFor(top[0]->data.numel(), kReluChunk, [&](int64_t begin, int64_t end) {
      ReluInPlaceKernel(y + begin, end - begin, slope);
    });
    return;
  }
  const T* x = bottom[0]->data.data<T>();  // bottom: any shape
  T* y = top[0]->data.data<T>();           // top: same shape
  ParallelFor(bottom[0]->data.numel(), kReluChunk, [&](int64_t begin, int64_t end) {
    ReluForwardKernel(x + begin, y + begin, end - begin, slope);
  });
}

template <typename T>
void ReluLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                          const Blobs& bottom) {
  if (!propagate_down[0]) return;
  // The sign of y is that of x unless the slope is negative; in place only y is left.
  const T* x = negative_slope_ >= 0 ? top[0]->data.data<T>() : bottom[0]->data.data<T>();
  const T* dy = top[0]->grad.data<T>();
  T* dx = bottom[0]->grad.data<T>();
  const T slope = static_cast<T>(negative_slope_);
  ParallelFor(bottom[0]->data.numel(), kReluChunk, [&](int64_t begin, int64_t end) {
    ReluBackwardKernel(x + begin, dy + begin, dx + begin, end - begin, slope);
  });
}

template class TypedLayer<ReluLayer, WideFloatTypes>;

CORTADO_REGISTER_LAYER(ReLU, ReluLayer);

}  // namespace cortado
