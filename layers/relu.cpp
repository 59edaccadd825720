#include "layers/relu.h"

#include "engine/thread_pool.h"
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
}  // namespace

void ReluLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  negative_slope_ = settings().GetFloat("negative_slope", 0.0);
}

void ReluLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  CheckFloatInput(*this, bottom[0]->data, "input");
  if (in_place_) {
    top[0]->data = bottom[0]->data;  // the same storage
  } else {
    top[0]->data.Resize(bottom[0]->data.shape(), bottom[0]->data.dtype());
  }
}

template <typename T>
void ReluLayer::ForwardCpu(const Blobs& bottom, const Blobs& top) {
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

void ReluLayer::ForwardF32(const Blobs& bottom, const Blobs& top) {
  ForwardCpu<float>(bottom, top);
}
void ReluLayer::ForwardF64(const Blobs& bottom, const Blobs& top) {
  ForwardCpu<double>(bottom, top);
}

template <typename T>
void ReluLayer::BackwardCpu(const Blobs& top, const std::vector<bool>& propagate_down,
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

void ReluLayer::BackwardF32(const Blobs& top, const std::vector<bool>& propagate_down,
                            const Blobs& bottom) {
  BackwardCpu<float>(top, propagate_down, bottom);
}
void ReluLayer::BackwardF64(const Blobs& top, const std::vector<bool>& propagate_down,
                            const Blobs& bottom) {
  BackwardCpu<double>(top, propagate_down, bottom);
}

CORTADO_REGISTER_LAYER(ReLU, ReluLayer);

}  // namespace cortado
