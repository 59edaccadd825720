// f16 and bf16 conversions written once for host and device: the CUDA kernels include this file
// and the host tests compare it, bit for bit, with the CPU's conversions (cortado::dist's, which
// the codecs and the mixed-precision paths use), so a tensor converted on a GPU holds exactly
// what the CPU reference would have made. Round to nearest, ties to even; NaN stays a quiet NaN
// (f16: the sign with 0x7e00; bf16: the upper half with the quiet bit set).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CORTADO_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CORTADO_HOST_DEVICE inline
#endif

namespace cortado::half_bits {

CORTADO_HOST_DEVICE uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

CORTADO_HOST_DEVICE float Float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

CORTADO_HOST_DEVICE uint16_t FloatToHalf(float f) {
  const uint32_t x = Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    // Below f16's smallest normal: scale by 2^24 (exact in f32) and round the integer part.
    const float magnitude = Float(abs) * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(magnitude);
    const float rest = magnitude - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  uint32_t h = (rounded - 0x38000000u) >> 13;
  if (h >= 0x7c00u) h = 0x7c00u;
  return static_cast<uint16_t>(sign | h);
}

CORTADO_HOST_DEVICE float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) return Float(Bits(static_cast<float>(man) * (1.0f / 16777216.0f)) | sign);
  if (exp == 31) return Float(sign | 0x7f800000u | (man << 13));
  return Float(sign | ((exp + 112u) << 23) | (man << 13));
}

CORTADO_HOST_DEVICE uint16_t FloatToBFloat16(float f) {
  uint32_t u = Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

CORTADO_HOST_DEVICE float BFloat16ToFloat(uint16_t b) {
  return Float(static_cast<uint32_t>(b) << 16);
}

}  // namespace cortado::half_bits
