// How the layers' shared kernel bodies (layers/*_kernels.h) read and write one element of each
// floating dtype: f32 and f64 as they are; bf16 and f16 as their 16-bit codes, widened to f32 on
// load and rounded to nearest even on store (cortado/dist/half.h, the conversions the CPU's
// codecs make). A body that loads, computes in Acc and stores once is then bit for bit the CPU's
// low-precision path, which widens its inputs, runs the f32 kernel and rounds the outputs back.
#pragma once

#include <cstdint>

#include "cortado/dist/half.h"

namespace cortado::kernels {

template <typename T>
struct PlainCodes {
  using Stored = T;
  using Acc = T;
  static CORTADO_HOST_DEVICE T Load(T v) { return v; }
  static CORTADO_HOST_DEVICE T Store(T v) { return v; }
};

struct BF16Codes {
  using Stored = uint16_t;
  using Acc = float;
  static CORTADO_HOST_DEVICE float Load(uint16_t v) { return dist::BFloat16ToFloat(v); }
  static CORTADO_HOST_DEVICE uint16_t Store(float v) { return dist::FloatToBFloat16(v); }
};

struct F16Codes {
  using Stored = uint16_t;
  using Acc = float;
  static CORTADO_HOST_DEVICE float Load(uint16_t v) { return dist::HalfToFloat(v); }
  static CORTADO_HOST_DEVICE uint16_t Store(float v) { return dist::FloatToHalf(v); }
};

}  // namespace cortado::kernels
