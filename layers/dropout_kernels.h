// The shared kernel bodies of Dropout (engine/tensor/indexed_launch.h): CORTADO_HOST_DEVICE
// functors of raw pointers and scalars, launched with RunIndexed on the test device and on a GPU
// (instantiated for CUDA in layers/cuda/dropout.cu). The mask is the CPU's counter-based draw
// (engine/base/counter_hash.h, integer arithmetic and one exact conversion), so it is the CPU's
// bit for bit on any device, and so are the outputs (one product and a select per element).
#pragma once

#include <cstdint>

#include "cortado/dist/half.h"  // CORTADO_HOST_DEVICE
#include "engine/base/counter_hash.h"

namespace cortado::kernels {

// Element i of the training forward: draws mask[i] (1 = kept) from the element's index in the
// global batch, counted in the logical (N, C, H, W) order, and writes y = kept ? x * scale : 0.
// Element f of local sample j is element f of global sample sample_base + j * stride; with
// channels > 1 the memory is channels-last, (h W + w) C + c, which is logical c H W + h W + w.
template <typename T>
struct DropoutForward {
  const T* x;
  T* y;
  uint8_t* mask;
  uint64_t base;  // HashCombine(HashCombine(seed, HashString(name)), iteration)
  double ratio;
  T scale;
  int64_t per_sample, sample_base, stride, channels, plane;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t j = i / per_sample, f = i - j * per_sample;
    const int64_t logical = channels > 1 ? (f % channels) * plane + f / channels : f;
    const int64_t global = (sample_base + j * stride) * per_sample + logical;
    const uint8_t kept =
        KeyToUniform(HashCombine(base, static_cast<uint64_t>(global))) >= ratio ? 1 : 0;
    mask[i] = kept;
    const T v = x[i] * scale;
    y[i] = kept ? v : T(0);
  }
};

// Element i of the training backward: dx = kept ? dy * scale : 0.
template <typename T>
struct DropoutBackward {
  const uint8_t* mask;
  const T* dy;
  T* dx;
  T scale;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const T v = dy[i] * scale;
    dx[i] = mask[i] ? v : T(0);
  }
};

// Element i of the identity (inference's forward and its backward): y = x.
template <typename T>
struct CopyElements {
  const T* x;
  T* y;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const { y[i] = x[i]; }
};

}  // namespace cortado::kernels
