// The shared kernel bodies of the layers that move data rather than compute it: Concat's slices
// and Split's sum of gradients (layers/concat.h, layers/split.h), launched by RunIndexed on the
// test device or a GPU (engine/tensor/indexed_launch.h; instantiated for CUDA in
// layers/cuda/copy.cu). Flatten and Reshape need none: forward is a view, backward a tensor copy.
#pragma once

#include <cstdint>

#include "layers/element_codes.h"

namespace cortado::kernels {

// One input's slice of a concatenation: the narrow tensor (outer, len, inner) is entries
// [offset, offset + len) along the axis of the wide one (outer, wide_len, inner). Counts are in
// copy units U (an unsigned type of 1, 2, 4 or 8 bytes): slice = len * inner, wide =
// wide_len * inner and at = offset * inner, each times the element's size over the unit's.
// Index i is the narrow tensor's unit i; to_wide copies it into the wide tensor (forward), else
// from it (backward). Bytes are copied as they are, whatever the dtype.
template <typename U>
struct SliceCopy {
  const U* src;
  U* dst;
  int64_t slice, wide, at;
  bool to_wide;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t o = i / slice;
    const int64_t w = o * wide + at + (i - o * slice);
    if (to_wide) {
      dst[w] = src[i];
    } else {
      dst[i] = src[w];
    }
  }
};

// Split's backward: the sum of up to kSumTopsPerPass tops' gradients per element, added in top
// order from the first, in Acc (f32 for bf16 and f16), as the CPU adds them. More tops take more
// passes: a later pass starts from the running sum `partial` (dx itself for f32 and f64, an f32
// buffer for 16-bit storage, rounded only by the last pass) instead of top 0.
inline constexpr int kSumTopsPerPass = 8;

template <class E>
struct SumTops {
  using S = typename E::Stored;
  using A = typename E::Acc;
  const S* dy[kSumTopsPerPass];
  int count;         // tops read by this pass
  const A* partial;  // the previous passes' sum, or null in the first pass
  S* out;            // the rounded sum (the last pass), or null
  A* running;        // the unrounded sum for a later pass (when out is null)
  CORTADO_HOST_DEVICE void operator()(int64_t i) const {
    A sum = partial != nullptr ? partial[i] : E::Load(dy[0][i]);
    for (int j = partial != nullptr ? 0 : 1; j < count; ++j) sum += E::Load(dy[j][i]);
    if (out != nullptr) {
      out[i] = E::Store(sum);
    } else {
      running[i] = sum;
    }
  }
};

}  // namespace cortado::kernels
