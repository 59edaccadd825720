// The gradient codecs value by value and group by group, written once for the CPU and the GPU:
// the portable kernel set (codec_portable.cpp) uses the per-value functions in its blocked loops,
// and the CUDA kernels (codecs/cuda/) run the per-group functions one group of 8 values per
// thread. The host tests run the group functions over whole buffers and hold them to the CPU
// codecs bit for bit (bytes, residuals, decoded values), so the GPU kernels compute what the CPU
// does even where no GPU is present to run them.
//
// Nothing here may use the standard library beyond <cstdint> and memcpy: device code cannot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cortado/dist/codec.h"
#include "cortado/dist/half.h"

namespace cortado::dist::codec_internal {

// Layout of a code: sign << (e + m) | exponent field << m | mantissa.
struct Format {
  int e;     // exponent bits
  int m;     // mantissa bits
  int bias;  // exponent bias; the field 2^e - 1 is infinity / NaN
};

CORTADO_HOST_DEVICE constexpr Format FormatOf(CodecKind kind) {
  switch (kind) {
    case CodecKind::kF16:
      return {5, 10, 15};
    case CodecKind::kBF16:
      return {8, 7, 127};
    case CodecKind::kEpgc11:
      return {5, 5, 15};
    case CodecKind::kEpgc9:
      return {8, 0, 127};
    case CodecKind::kEpgc8:
      return {5, 2, 15};
    case CodecKind::kF32:
      break;
  }
  return {8, 23, 127};
}

// Bits per value of a format (CodecBits without its argument check).
CORTADO_HOST_DEVICE constexpr int BitsOf(CodecKind kind) {
  const Format f = FormatOf(kind);
  return 1 + f.e + f.m;
}

// StochasticBits(seed, index) = Fmix32(HashBase(seed, index) ^ HashKey(seed, index)), in pieces
// a kernel can hoist: for a stretch of indices sharing their upper 32 bits, HashKey is constant
// and HashBase advances by kHashLo per index.
constexpr uint32_t kHashLo = 0x9E3779B1u;    // multiplies index bits 0..31
constexpr uint32_t kHashHi = 0x85EBCA77u;    // multiplies index bits 32..63
constexpr uint32_t kHashSeed = 0xC2B2AE3Du;  // multiplies seed bits 32..63
constexpr uint32_t kMix1 = 0x85EBCA6Bu;      // Fmix32's multipliers
constexpr uint32_t kMix2 = 0xC2B2AE35u;
CORTADO_HOST_DEVICE uint32_t HashBase(uint64_t seed, uint64_t index) {
  return static_cast<uint32_t>(index) * kHashLo + static_cast<uint32_t>(seed);
}
CORTADO_HOST_DEVICE uint32_t HashKey(uint64_t seed, uint64_t index) {
  return static_cast<uint32_t>(index >> 32) * kHashHi ^
         static_cast<uint32_t>(seed >> 32) * kHashSeed;
}
// murmur3's 32-bit finalizer: every input bit reaches every output bit.
CORTADO_HOST_DEVICE uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= kMix1;
  h ^= h >> 13;
  h *= kMix2;
  h ^= h >> 16;
  return h;
}
CORTADO_HOST_DEVICE uint32_t RandomWord(uint64_t seed, uint64_t index) {
  return Fmix32(HashBase(seed, index) ^ HashKey(seed, index));
}

using dist::BitsToFloat;
using dist::FloatToBits;
CORTADO_HOST_DEVICE int MaxInt(int a, int b) { return a > b ? a : b; }
CORTADO_HOST_DEVICE int MinInt(int a, int b) { return a < b ? a : b; }

// The code of fp32 bits u (the reference's EncodeValue), branch-free; r is the value's random
// word (kStochastic only). E8 formats (bf16, epgc9) share fp32's exponent, so base + q of the
// reference is simply abs >> s; the E5 formats need a per-value s.
template <CodecKind K, Rounding R>
CORTADO_HOST_DEVICE uint32_t EncodeBits(uint32_t u, uint32_t r) {
  constexpr Format f = FormatOf(K);
  constexpr uint32_t inf = ((1u << f.e) - 1) << f.m;
  constexpr uint32_t qnan = f.m > 0 ? 1u << (f.m > 0 ? f.m - 1 : 0) : 0u;
  const uint32_t abs = u & 0x7fffffffu;
  uint32_t mag;
  if constexpr (f.e == 8) {
    constexpr int s = 23 - f.m;
    if constexpr (R == Rounding::kNearest) {
      // Ties go to an even q: q's low bit is abs's bit s, except for epgc9 (q is the implicit
      // bit alone: 1 for normal x, 0 for subnormal).
      const uint32_t odd = f.m > 0 ? (abs >> s) & 1u : (abs >= 0x800000u ? 1u : 0u);
      mag = (abs + ((1u << (s - 1)) - 1) + odd) >> s;
    } else if constexpr (R == Rounding::kTruncate) {
      mag = abs >> s;
    } else {
      const uint32_t rem = abs & ((1u << s) - 1);
      mag = (abs >> s) + (r < (rem << (32 - s)) ? 1u : 0u);
    }
  } else {
    const uint32_t ef = abs >> 23;
    const uint32_t sig = (u & 0x7fffffu) | (ef != 0 ? 0x800000u : 0u);
    const int e1 = MaxInt(static_cast<int>(ef), 1);
    constexpr int kNormal = 127 - f.bias + 1;  // e1 from which x is normal in the target
    const uint32_t base = static_cast<uint32_t>(MaxInt(e1 - kNormal, 0)) << f.m;
    const int s = 23 - f.m + MaxInt(kNormal - e1, 0);
    if constexpr (R == Rounding::kNearest) {
      const int sn = MinInt(s, 25);  // from 25 on, x is below half the smallest subnormal
      const uint32_t odd = (sig >> sn) & 1u;
      mag = base + ((sig + ((1u << (sn - 1)) - 1) + odd) >> sn);
    } else if constexpr (R == Rounding::kTruncate) {
      mag = base + (s < 32 ? sig >> s : 0u);
    } else {
      const int sc = MinInt(s, 40);
      const uint32_t q = sc < 32 ? sig >> sc : 0u;
      const uint32_t rem = sc < 32 ? sig & ((1u << sc) - 1) : sig;
      const uint32_t threshold = sc <= 32 ? rem << (32 - sc) : rem >> (sc - 32);
      mag = base + q + (r < threshold ? 1u : 0u);
    }
  }
  mag = mag < inf ? mag : inf;
  if (abs > 0x7f800000u) mag |= qnan;
  return mag | (u >> 31) << (f.e + f.m);
}

// All ones where `condition`, else 0: selects by masks keep the loops free of branches (and
// so vectorizable).
CORTADO_HOST_DEVICE uint32_t Mask(bool condition) { return 0u - static_cast<uint32_t>(condition); }

// HalfToFloat on bits, branch-free (equal on all 65,536 inputs: tested).
CORTADO_HOST_DEVICE uint32_t HalfBitsToFloatBits(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t a = h & 0x7fffu;
  const uint32_t exp = a >> 10;
  const uint32_t normal = (a << 13) + (112u << 23);  // rebias 15 -> 127
  const uint32_t special = normal + (112u << 23);    // field 31 -> 255, payload kept
  const uint32_t sub = FloatToBits(static_cast<float>(a) * 0x1p-24f);  // a < 1024: exact
  const uint32_t is_sub = Mask(exp == 0), is_special = Mask(exp == 31);
  return sign | (sub & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special));
}

// fp32 bits of a code (the reference's DecodeValue).
template <CodecKind K>
CORTADO_HOST_DEVICE uint32_t DecodeBits(uint32_t code) {
  constexpr Format f = FormatOf(K);
  if constexpr (f.e == 8) {
    return code << (31 - f.e - f.m);  // sign lands on bit 31, the rest on fp32's places
  } else {
    return HalfBitsToFloatBits(code << (10 - f.m));
  }
}

// residual += x - d where both are finite, else += 0. If x or d is not finite, x - d is not
// either, and when both are, |x - d| is below one gap of the format: so testing the difference
// is the same test, and it keeps the loop free of branches. (Compiled without fused
// multiply-adds everywhere: -ffp-contract=off on the host, __fsub_rn on the device.)
CORTADO_HOST_DEVICE float Loss(float x, float d) {
#if defined(__CUDA_ARCH__)
  const uint32_t diff = FloatToBits(__fsub_rn(x, d));
#else
  const uint32_t diff = FloatToBits(x - d);
#endif
  return BitsToFloat(diff & ~Mask((diff & 0x7f800000u) == 0x7f800000u));
}

// The bit-packed formats (epgc11, epgc9) per group of k <= 8 values: k high bytes, then the
// L-bit low parts as L*k bits in bit-plane order (bit p of value j at bit p*k + j).
template <CodecKind K>
struct Split;
template <>
struct Split<CodecKind::kEpgc11> {
  static constexpr int kLow = 3;
  CORTADO_HOST_DEVICE static uint32_t High(uint32_t c) { return c >> 3; }
  CORTADO_HOST_DEVICE static uint32_t Low(uint32_t c) { return c & 7u; }
  CORTADO_HOST_DEVICE static uint32_t Join(uint32_t high, uint32_t low) { return high << 3 | low; }
};
template <>
struct Split<CodecKind::kEpgc9> {
  static constexpr int kLow = 1;
  CORTADO_HOST_DEVICE static uint32_t High(uint32_t c) { return c & 0xffu; }
  CORTADO_HOST_DEVICE static uint32_t Low(uint32_t c) { return c >> 8; }
  CORTADO_HOST_DEVICE static uint32_t Join(uint32_t high, uint32_t low) { return low << 8 | high; }
};

// ---- One group of 8 values (the last group of a stream may hold fewer) --------------------------

// Writes the k codes of a group to dst, the group's first byte (f16, bf16, epgc8: any k codes,
// these formats have no groups).
template <CodecKind K>
CORTADO_HOST_DEVICE void PackGroup(const uint32_t* codes, int k, uint8_t* dst) {
  if constexpr (K == CodecKind::kF16 || K == CodecKind::kBF16) {
    for (int j = 0; j < k; ++j) {  // little-endian 16-bit words
      dst[2 * j] = static_cast<uint8_t>(codes[j]);
      dst[2 * j + 1] = static_cast<uint8_t>(codes[j] >> 8);
    }
  } else if constexpr (K == CodecKind::kEpgc8) {
    for (int j = 0; j < k; ++j) dst[j] = static_cast<uint8_t>(codes[j]);
  } else {
    using S = Split<K>;
    uint32_t planes = 0;  // at most 3 * 8 bits
    for (int j = 0; j < k; ++j) {
      dst[j] = static_cast<uint8_t>(S::High(codes[j]));
      const uint32_t low = S::Low(codes[j]);
      for (int p = 0; p < S::kLow; ++p) planes |= ((low >> p) & 1u) << (p * k + j);
    }
    for (int b = 0; b < (S::kLow * k + 7) / 8; ++b)
      dst[k + b] = static_cast<uint8_t>(planes >> 8 * b);
  }
}

// Reads the k codes of the group starting at src.
template <CodecKind K>
CORTADO_HOST_DEVICE void UnpackGroup(const uint8_t* src, int k, uint32_t* codes) {
  if constexpr (K == CodecKind::kF16 || K == CodecKind::kBF16) {
    for (int j = 0; j < k; ++j) codes[j] = uint32_t{src[2 * j]} | uint32_t{src[2 * j + 1]} << 8;
  } else if constexpr (K == CodecKind::kEpgc8) {
    for (int j = 0; j < k; ++j) codes[j] = src[j];
  } else {
    using S = Split<K>;
    uint32_t planes = 0;
    for (int b = 0; b < (S::kLow * k + 7) / 8; ++b) planes |= uint32_t{src[k + b]} << 8 * b;
    for (int j = 0; j < k; ++j) {
      uint32_t low = 0;
      for (int p = 0; p < S::kLow; ++p) low |= ((planes >> (p * k + j)) & 1u) << p;
      codes[j] = S::Join(src[j], low);
    }
  }
}

// Group g of a stream: its first value is 8g, its first byte BitsOf(K) * g.
template <CodecKind K>
CORTADO_HOST_DEVICE size_t GroupByteOffset(size_t group) {
  return static_cast<size_t>(BitsOf(K)) * group;
}

// Encodes the k values of src (stream indices first_index ..) into the group's bytes at dst;
// with kResidual, residual[j] += what value j lost.
template <CodecKind K, Rounding R, bool kResidual>
CORTADO_HOST_DEVICE void EncodeGroup(const float* src, int k, uint8_t* dst, uint64_t seed,
                                     uint64_t first_index, float* residual) {
  uint32_t codes[8];
  for (int j = 0; j < k; ++j) {
    const uint32_t u = FloatToBits(src[j]);
    const uint32_t r = R == Rounding::kStochastic ? RandomWord(seed, first_index + j) : 0u;
    codes[j] = EncodeBits<K, R>(u, r);
    if constexpr (kResidual)
      residual[j] = residual[j] + Loss(src[j], BitsToFloat(DecodeBits<K>(codes[j])));
  }
  PackGroup<K>(codes, k, dst);
}

// Decodes the k values of the group at src into dst (kAccumulate: dst[j] += value j, in fp32).
template <CodecKind K, bool kAccumulate>
CORTADO_HOST_DEVICE void DecodeGroup(const uint8_t* src, int k, float* dst) {
  uint32_t codes[8];
  UnpackGroup<K>(src, k, codes);
  for (int j = 0; j < k; ++j) {
    const float d = BitsToFloat(DecodeBits<K>(codes[j]));
#if defined(__CUDA_ARCH__)
    dst[j] = kAccumulate ? __fadd_rn(dst[j], d) : d;
#else
    dst[j] = kAccumulate ? dst[j] + d : d;
#endif
  }
}

}  // namespace cortado::dist::codec_internal
