// AVX2 + F16C kernels of the gradient codecs. Every function carries its own target attribute,
// so they are built whatever -march says and run only where ActiveIsa() found the CPU able.
// They reach EncodeValue's exact result by the cheapest route per format and mode:
//   f16 nearest, truncate: F16C, fixed up where it differs from the format (NaN payloads;
//     overflow when truncating);
//   epgc11, epgc8 nearest: F16C toward zero with the inexact bit kept ("round to odd"), then
//     integer rounding of the f16 words to 5 or 2 mantissa bits: one correct rounding;
//   epgc11, epgc8 truncate: F16C toward zero (fixed up), then dropping the bits;
//   bf16, epgc9, and every stochastic mode: the integer formula in 32-bit lanes (for the E5
//     formats, variable shifts give the subnormals their per-value shift; AVX2 shifts by 32 or
//     more give 0, as the formula wants).
// The residual is computed in the same pass from the codes. Loops cover whole blocks of 16 or
// 32 values; the rest goes to the portable kernels, which give the same bits.
#include "codecs/codec_internal.h"

#if CORTADO_CODEC_HAVE_AVX2

#include <immintrin.h>

#include <cstring>

#include "codecs/codec_dispatch.h"

#define CORTADO_SIMD_TARGET "avx2,f16c,fma"
#define CORTADO_SIMD_BYTES 32
#include "codecs/codec_simd.h"

namespace cortado::dist::codec_internal {
namespace {

// Per plane p of epgc11: a pshufb table of "bit p of v" for the 16 values v of a low part, 0xff
// where set, else 0 (encoding); and byte 8 + p, where plane p's byte of a group lies in its
// 128-bit half (decoding).
constexpr ByteTable BitSet(int p) {
  return MakeTable([p](int v) { return ((v & 15) >> p) & 1 ? 0xff : 0; });
}
constexpr ByteTable kBitSet[3] = {BitSet(0), BitSet(1), BitSet(2)};
constexpr ByteTable kPlaneByte[3] = {Splat(8), Splat(9), Splat(10)};

// The constants of a format's loops (FormatConsts) and this set's own: F16C's fix-ups' infinity,
// f16 words in 32-bit lanes.
template <int E, int M>
struct Consts : FormatConsts<E, M> {
  CORTADO_SIMD_INLINE Consts() {}

  __m256 f_inf = Floats(U32(0x7f800000u));
  __m256i h_abs32 = U32(0x7fff), h_inf32 = U32(0x7c00);
  // Packing: dword order after two packs; epgc11's low part; bit j of byte j (of 8); per plane
  // p a byte table of "bit p of v" (encode) and plane byte p's spread (decode), low bit p's
  // place in an f16 word; epgc9's sign bit j to bit 31.
  __m256i pack_order = Keep(_mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  __m256i low3 = U16(7);
  __m256i lane_bit = Load(kBitOfByte);
  __m256i bit_table[3] = {Load(kBitSet[0]), Load(kBitSet[1]), Load(kBitSet[2])};
  __m256i plane_spread[3] = {Load(kPlaneByte[0]), Load(kPlaneByte[1]), Load(kPlaneByte[2])};
  __m256i low_at[3] = {Load(kLowBitInWord[0]), Load(kLowBitInWord[1]), Load(kLowBitInWord[2])};
  __m256i to_sign = Keep(_mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24));
};

// v + (a < b) as unsigned (AVX2 compares only signed): v + 1 + (all ones where a >= b).
template <class C>
CORTADO_SIMD_INLINE __m256i AddOneIfBelow(const C& k, __m256i v, __m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_add_epi32(v, k.one),
                          _mm256_cmpeq_epi32(_mm256_max_epu32(a, b), a));
}

// Saturating to infinity and marking NaN, shared by the cores: mag -> final magnitude.
template <int E, int M>
CORTADO_SIMD_INLINE __m256i Finish(const Consts<E, M>& k, __m256i mag, __m256i abs) {
  mag = _mm256_min_epu32(mag, k.inf);
  if constexpr (M > 0) {
    const __m256i nan = _mm256_cmpgt_epi32(abs, k.exp_all);
    mag = _mm256_or_si256(mag, _mm256_and_si256(nan, k.qnan));
  }
  return mag;
}

// v + (a > b), for a and b below 2^31: v - (all ones where a > b, a signed compare).
template <class C>
CORTADO_SIMD_INLINE __m256i AddOneIfAbove(const C&, __m256i v, __m256i a, __m256i b) {
  return _mm256_sub_epi32(v, _mm256_cmpgt_epi32(a, b));
}

// Magnitude code (no sign) of E5 formats (bias 15), stochastic: the integer formula
// (codec_simd.h; AVX2's variable shifts give the subnormals their per-value shift).
template <int M>
CORTADO_SIMD_INLINE __m256i MagE5Stochastic(const Consts<5, M>& k, __m256i u, __m256i r) {
  return MagE5StochasticFormula<M>(k, _mm256_and_si256(u, k.abs), r);
}

// Codes of 8 values of at most 16 bits, two vectors -> 16 little-endian words in order.
template <class C>
CORTADO_SIMD_INLINE __m256i Pack16(const C&, __m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
}

// Two vectors of 8 values below 256 -> 16 bytes in order.
template <class C>
CORTADO_SIMD_INLINE __m128i Pack8x2(const C& k, __m256i a, __m256i b) {
  const __m256i w = _mm256_packus_epi32(a, b);  // a0-3 b0-3 | a4-7 b4-7
  const __m256i y = _mm256_packus_epi16(w, w);  // dwords: A0 B0 A0 B0 | A1 B1 A1 B1
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(y, k.pack_order));
}

// Sixteen f16 words, x0's in words 0-7 and x1's in 8-15, by F16C with the places it differs
// from the format fixed: a NaN keeps its top payload bits (quieted) where the format has the
// canonical sign | 0x7e00; toward zero it saturates to 65504 where the format overflows to
// infinity from 2^16 up (kTruncate fixes that). kOdd rounds toward zero and sets the lowest
// bit where that was inexact ("round to odd"): with at least 2 bits to spare, rounding such
// words again to fewer mantissa bits, to nearest, gives x rounded to nearest once. (65504 with
// the bit stands for all above 65504, which epgc11 and epgc8 round to infinity, as they should.)
enum class F16Mode { kNearest, kTruncate, kOdd };
template <F16Mode kMode, class C>
CORTADO_SIMD_INLINE __m256i F16Words(const C& k, __m256 x0, __m256 x1) {
  if constexpr (kMode == F16Mode::kTruncate) {
    const __m256 sign = Floats(k.sign);
    const __m256 over0 = _mm256_cmp_ps(_mm256_andnot_ps(sign, x0), k.f_two16, _CMP_GE_OQ);
    const __m256 over1 = _mm256_cmp_ps(_mm256_andnot_ps(sign, x1), k.f_two16, _CMP_GE_OQ);
    x0 = _mm256_blendv_ps(x0, _mm256_or_ps(_mm256_and_ps(x0, sign), k.f_inf), over0);
    x1 = _mm256_blendv_ps(x1, _mm256_or_ps(_mm256_and_ps(x1, sign), k.f_inf), over1);
  }
  constexpr int kRound =
      kMode == F16Mode::kNearest ? _MM_FROUND_TO_NEAREST_INT : _MM_FROUND_TO_ZERO;
  const __m128i h0 = _mm256_cvtps_ph(x0, kRound), h1 = _mm256_cvtps_ph(x1, kRound);
  __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1);
  if constexpr (kMode == F16Mode::kOdd) {
    const __m256 inexact0 = _mm256_cmp_ps(_mm256_cvtph_ps(h0), x0, _CMP_NEQ_OQ);  // NaN: no
    const __m256 inexact1 = _mm256_cmp_ps(_mm256_cvtph_ps(h1), x1, _CMP_NEQ_OQ);
    const __m256i inexact =
        _mm256_permute4x64_epi64(_mm256_packs_epi32(Bits(inexact0), Bits(inexact1)), 0xD8);
    h = _mm256_or_si256(h, _mm256_srli_epi16(inexact, 15));
  }
  const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, k.h_abs), k.h_inf);
  return _mm256_andnot_si256(_mm256_and_si256(nan, k.h_payload), h);
}

// The codes (with M mantissa bits) of 16 f16 words from F16Words: kOdd words rounded to
// nearest, ties to even; kTruncate words truncated. No carry reaches the sign: the largest
// non-NaN magnitude is infinity's, and the NaN words are canonical, both round to themselves.
template <int M, Rounding R, class C>
CORTADO_SIMD_INLINE __m256i WordsToCodes(const C& k, __m256i h) {
  constexpr int s = 10 - M;
  if constexpr (R == Rounding::kNearest) {
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(h, s), k.one16);
    h = _mm256_add_epi16(_mm256_add_epi16(h, k.half_m1_16), odd);
  }
  return _mm256_srli_epi16(h, s);
}

// The 16 codes (in 16-bit words, in order) of x0 and x1 for an E5 format.
template <int M, Rounding R, class C, class Stream>
CORTADO_SIMD_INLINE __m256i E5Codes(const C& k, __m256 x0, __m256 x1, Stream& random) {
  constexpr bool kNearest = R == Rounding::kNearest;
  if constexpr (R == Rounding::kStochastic) {
    return E5StochasticCodes<M>(k, x0, x1, random);
  } else if constexpr (M == 10) {
    constexpr F16Mode kMode = kNearest ? F16Mode::kNearest : F16Mode::kTruncate;
    return F16Words<kMode>(k, x0, x1);
  } else {
    constexpr F16Mode kMode = kNearest ? F16Mode::kOdd : F16Mode::kTruncate;
    return WordsToCodes<M, R>(k, F16Words<kMode>(k, x0, x1));
  }
}

// residual += x - d where finite, else += 0 (see Loss in codec_portable.cpp: the difference is
// finite exactly when x and d both are).
template <class C>
CORTADO_SIMD_INLINE void AddLoss(const C& k, __m256 x, __m256 d, float* residual) {
  const __m256 diff = _mm256_sub_ps(x, d);
  const __m256 finite = _mm256_cmp_ps(_mm256_and_ps(diff, Floats(k.abs)), k.f_inf, _CMP_LT_OQ);
  _mm256_storeu_ps(residual, _mm256_add_ps(_mm256_loadu_ps(residual), _mm256_and_ps(diff, finite)));
}

// The floats of 16 f16 words: F16C, except that it quiets signalling NaNs (sets fp32 bit 22)
// where HalfToFloat keeps them. NaN words are rare, so test for any first.
template <class C>
CORTADO_SIMD_INLINE __m256 FixNan(const C& k, __m256 d, __m128i h) {
  const __m256i h32 = _mm256_cvtepu16_epi32(h);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(h32, k.h_abs32), k.h_inf32);
  const __m256i quieted = _mm256_andnot_si256(_mm256_slli_epi32(h32, 13), k.quiet);
  return Floats(_mm256_xor_si256(Bits(d), _mm256_and_si256(nan, quieted)));
}
// kExact: as HalfToFloat, NaN payloads included; else as F16C (what a residual needs: it
// ignores NaN lanes, and the encoder makes only quiet NaNs anyway).
template <bool kExact = true, class C>
CORTADO_SIMD_INLINE void HalvesToFloats(const C& k, __m256i h, __m256& d0, __m256& d1) {
  const __m128i lo = _mm256_castsi256_si128(h), hi = _mm256_extracti128_si256(h, 1);
  d0 = _mm256_cvtph_ps(lo);
  d1 = _mm256_cvtph_ps(hi);
  if constexpr (kExact) {
    const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, k.h_abs), k.h_inf);
    if (!_mm256_testz_si256(nan, nan)) [[unlikely]] {
      d0 = FixNan(k, d0, lo);
      d1 = FixNan(k, d1, hi);
    }
  }
}

template <CodecKind K>
using ConstsOf = Consts<FormatOf(K).e, FormatOf(K).m>;

}  // namespace

// ---- Encode ---------------------------------------------------------------------------------

// Loops<Isa::kAvx2> (codec_dispatch.h): whole blocks from the start, as many as fit; returns
// how many values they held (a multiple of 8).
template <CodecKind K, Rounding R, bool kResidual>
CORTADO_SIMD_LOOP size_t EncodeLoopAvx2(const float* src, size_t count, uint8_t* dst,
                                        const EncodeOptions& o, float* residual) {
  const ConstsOf<K> k;
  RandomStream<ConstsOf<K>> random(k, o.seed, o.first_index);
  size_t i = 0;
  if constexpr (K == CodecKind::kF16) {
    for (; i + 16 <= count; i += 16) {
      const __m256 x0 = _mm256_loadu_ps(src + i), x1 = _mm256_loadu_ps(src + i + 8);
      const __m256i h = E5Codes<10, R>(k, x0, x1, random);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), h);
      if constexpr (kResidual) {
        AddLoss(k, x0, _mm256_cvtph_ps(_mm256_castsi256_si128(h)), residual + i);
        AddLoss(k, x1, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), residual + i + 8);
      }
    }
  } else if constexpr (K == CodecKind::kBF16) {
    for (; i + 16 <= count; i += 16) {
      const __m256i u0 = Bits(_mm256_loadu_ps(src + i)), u1 = Bits(_mm256_loadu_ps(src + i + 8));
      const __m256i c0 = WithSign(k, MagE8<7, R>(k, u0, Draw<R>(random)), u0);
      const __m256i c1 = WithSign(k, MagE8<7, R>(k, u1, Draw<R>(random)), u1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), Pack16(k, c0, c1));
      if constexpr (kResidual) {
        AddLoss(k, Floats(u0), Floats(_mm256_slli_epi32(c0, 16)), residual + i);
        AddLoss(k, Floats(u1), Floats(_mm256_slli_epi32(c1, 16)), residual + i + 8);
      }
    }
  } else if constexpr (K == CodecKind::kEpgc8) {
    for (; i + 32 <= count; i += 32) {
      __m256 x[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) x[j] = _mm256_loadu_ps(src + i + 8 * j);
      // The codes in 16-bit words: a holds values 0-15, b 16-31 (two statements: draws in order).
      const __m256i a = E5Codes<2, R>(k, x[0], x[1], random);
      const __m256i b = E5Codes<2, R>(k, x[2], x[3], random);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8));
      if constexpr (kResidual) {
        // A code is the top byte of an f16 word.
        __m256 d[4];
        HalvesToFloats<false>(k, _mm256_slli_epi16(a, 8), d[0], d[1]);
        HalvesToFloats<false>(k, _mm256_slli_epi16(b, 8), d[2], d[3]);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) AddLoss(k, x[j], d[j], residual + i + 8 * j);
      }
    }
  } else if constexpr (K == CodecKind::kEpgc11) {
    // Two groups per step, stored as 16 + 16 bytes of which the last 5 spill into the next
    // group's place (rewritten by the next step): so a step needs a group after it.
    for (; i + 24 <= count; i += 16) {
      const __m256 x0 = _mm256_loadu_ps(src + i), x1 = _mm256_loadu_ps(src + i + 8);
      // The 16 codes in 16-bit words: group 0 in the low half, group 1 in the high.
      const __m256i c = E5Codes<5, R>(k, x0, x1, random);
      // Per 128-bit half (a group): 8 bytes of high parts (code >> 3), 8 of low (code & 7).
      const __m256i b = _mm256_packus_epi16(_mm256_srli_epi16(c, 3), _mm256_and_si256(c, k.low3));
      // Plane p: bit p of low part j as bit j of a byte. A table lookup gives 0xff where the
      // bit is set, a mask keeps bit j of byte j, and summing the 8 bytes (psadbw) gathers
      // them in one byte; the high parts' qwords compute garbage, dropped by the blend.
      const __m256i zero = _mm256_setzero_si256();
      __m256i planes = zero;
#pragma GCC unroll 3
      for (int p = 0; p < 3; ++p) {
        const __m256i set = _mm256_and_si256(_mm256_shuffle_epi8(k.bit_table[p], b), k.lane_bit);
        planes = _mm256_or_si256(planes, _mm256_slli_epi64(_mm256_sad_epu8(set, zero), 8 * p));
      }
      const __m256i groups = _mm256_blend_epi32(b, planes, 0xCC);  // high parts | planes
      uint8_t* out = dst + i / 8 * 11;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(groups));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 11), _mm256_extracti128_si256(groups, 1));
      if constexpr (kResidual) {
        __m256 d0, d1;
        HalvesToFloats<false>(k, _mm256_slli_epi16(c, 5), d0, d1);  // the f16 words
        AddLoss(k, x0, d0, residual + i);
        AddLoss(k, x1, d1, residual + i + 8);
      }
    }
  } else if constexpr (K == CodecKind::kEpgc9) {
    for (; i + 16 <= count; i += 16) {
      const __m256 x0 = _mm256_loadu_ps(src + i), x1 = _mm256_loadu_ps(src + i + 8);
      const __m256i m0 = MagE8<0, R>(k, Bits(x0), Draw<R>(random));  // the exponent byte
      const __m256i m1 = MagE8<0, R>(k, Bits(x1), Draw<R>(random));
      const __m128i high = Pack8x2(k, m0, m1);
      uint8_t* out = dst + i / 8 * 9;
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out), high);
      out[8] = static_cast<uint8_t>(_mm256_movemask_ps(x0));  // the sign plane
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 9), _mm_unpackhi_epi64(high, high));
      out[17] = static_cast<uint8_t>(_mm256_movemask_ps(x1));
      if constexpr (kResidual) {
        const __m256 sign = Floats(k.sign);
        AddLoss(k, x0, _mm256_or_ps(_mm256_and_ps(x0, sign), Floats(_mm256_slli_epi32(m0, 23))),
                residual + i);
        AddLoss(k, x1, _mm256_or_ps(_mm256_and_ps(x1, sign), Floats(_mm256_slli_epi32(m1, 23))),
                residual + i + 8);
      }
    }
  }
  return i;
}

// ---- Decode ---------------------------------------------------------------------------------

// Loops<Isa::kAvx2> (codec_dispatch.h), as Encode, for the packed formats (the others:
// DecodeWideningLoop, codec_simd.h).
template <CodecKind K, bool kAccumulate>
CORTADO_SIMD_LOOP size_t DecodeLoopAvx2(const uint8_t* src, size_t count, float* dst) {
  const ConstsOf<K> k;
  size_t i = 0;
  if constexpr (K == CodecKind::kEpgc11) {
    // Two groups per step, one per 128-bit half, loaded 16 bytes each: 5 past the second
    // group, so a step needs a group after it.
    for (; i + 24 <= count; i += 16) {
      const uint8_t* in = src + i / 8 * 11;
      const __m256i v = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 11)), 1);
      // Byte j of a half: plane p's byte (8 + p) spread, bit j kept, set to bit 5 + p: the low
      // part's place in the f16 word (the code << 5). Interleaved with the high parts, they
      // make the words.
      __m256i low = _mm256_setzero_si256();
#pragma GCC unroll 3
      for (int p = 0; p < 3; ++p) {
        const __m256i plane =
            _mm256_and_si256(_mm256_shuffle_epi8(v, k.plane_spread[p]), k.lane_bit);
        low = _mm256_or_si256(low,
                              _mm256_and_si256(_mm256_cmpeq_epi8(plane, k.lane_bit), k.low_at[p]));
      }
      __m256 d0, d1;
      HalvesToFloats(k, _mm256_unpacklo_epi8(low, v), d0, d1);
      Put<kAccumulate>(dst + i, d0);
      Put<kAccumulate>(dst + i + 8, d1);
    }
  } else if constexpr (K == CodecKind::kEpgc9) {
    for (; i + 8 <= count; i += 8) {
      // The exponent bytes to fp32's exponent; lane j's sign, bit j of the plane, to bit 31.
      const uint8_t* in = src + i / 8 * 9;
      const __m256i exp =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in)));
      const __m256i sign =
          _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(in[8]), k.to_sign), k.sign);
      Put<kAccumulate>(dst + i, Floats(_mm256_or_si256(_mm256_slli_epi32(exp, 23), sign)));
    }
  } else {
    static_assert(K == CodecKind::kEpgc8, "f32, f16, bf16: DecodeWideningLoop");
    for (; i + 32 <= count; i += 32) {
      // Each byte becomes the top byte of an f16 word; unpack pairs 128-bit halves, so the
      // vectors hold values 0-7 | 16-23 and 8-15 | 24-31.
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      const __m256i zero = _mm256_setzero_si256();
      __m256 d[4];
      HalvesToFloats(k, _mm256_unpacklo_epi8(zero, bytes), d[0], d[2]);
      HalvesToFloats(k, _mm256_unpackhi_epi8(zero, bytes), d[1], d[3]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) Put<kAccumulate>(dst + i + 8 * j, d[j]);
    }
  }
  return i;
}

CORTADO_SIMD_KERNEL_SET(Isa::kAvx2, EncodeLoopAvx2, DecodeLoopAvx2);

}  // namespace cortado::dist::codec_internal

#endif  // CORTADO_CODEC_HAVE_AVX2
