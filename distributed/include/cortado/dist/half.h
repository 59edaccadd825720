// fp32 bits and the fp16 / bf16 conversions, written once for host and device code: the CPU
// paths (collectives, codecs, the engine's mixed precision) and the CUDA kernels compile these
// same functions, so a value converted on a GPU is bit for bit what the CPU makes of it.
// Round to nearest, ties to even; NaN stays a quiet NaN (f16: the sign with 0x7e00; bf16: the
// upper half with the quiet bit set).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CORTADO_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CORTADO_HOST_DEVICE inline
#endif

namespace cortado::dist {

CORTADO_HOST_DEVICE uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
CORTADO_HOST_DEVICE float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE 754 binary16, as raw bits.
CORTADO_HOST_DEVICE uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in half: scale by 2^24 using float arithmetic (exact round to even).
    const float magnitude = BitsToFloat(abs) * 16777216.0f;  // 2^24
    uint32_t m = static_cast<uint32_t>(magnitude);
    const float rest = magnitude - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits, ties to even.
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  uint32_t h = (rounded - 0x38000000u) >> 13;
  if (h >= 0x7c00u) h = 0x7c00u;
  return static_cast<uint16_t>(sign | h);
}

CORTADO_HOST_DEVICE float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float magnitude = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return BitsToFloat(FloatToBits(magnitude) | sign);
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (man << 13));
  return BitsToFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

// bfloat16 (the upper half of an f32), as raw bits; NaN stays NaN.
CORTADO_HOST_DEVICE uint16_t FloatToBFloat16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}
CORTADO_HOST_DEVICE float BFloat16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

}  // namespace cortado::dist
