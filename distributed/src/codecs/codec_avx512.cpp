// AVX-512 kernels of the gradient codecs (F, BW, DQ, VL and VBMI, with F16C). Every function
// carries its own target attribute, so they are built whatever -march says and run only where
// ActiveIsa() found the CPU able. They follow the AVX2 kernels' routes to EncodeValue's exact
// result (see codec_avx2.cpp), 16 values per vector, with what AVX-512 adds:
//   - unsigned compares into mask registers: stochastic rounding adds the mask's 1 (r <
//     threshold) directly, and NaN and overflow fix-ups are masked moves; stochastic E5
//     rounding takes a fixed-shift formula for vectors with no subnormal target lane;
//   - bit-packed formats (epgc11, epgc9) in 64 values at a time, 8 groups: the planes are
//     gathered by vptestmw (bit p of each code word, as a mask of 64 bits) or, for epgc9's
//     signs, vpmovd2m; the high bytes and the plane bytes are then put in place by two VBMI
//     byte permutes (vpermt2b) from tables made at compile time; decoding permutes back and
//     sets the low bits by masked byte adds from vptestmb.
// Not used: AVX512_BF16's VCVTNEPS2BF16. It rounds to nearest even like bf16's kNearest but
// flushes fp32 subnormals to zero and quiets NaNs its own way, so it would need the integer
// formula as a fix-up anyway; the integer formula alone is a few instructions. Loops cover
// blocks of 32 or 64 values; the rest goes to the AVX2 kernels (every CPU with AVX-512 here has
// AVX2: CpuHasAvx512 asks for both), which hand their own rest to the portable ones.
#include "codecs/codec_internal.h"

#if CORTADO_CODEC_HAVE_AVX512

// GCC 12's AVX-512 headers make their "undefined" vectors by self-initialization, which its
// -Wmaybe-uninitialized reports where they inline (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstring>

#include "codecs/codec_dispatch.h"

#define CORTADO_SIMD_TARGET "avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx2,f16c"
#define CORTADO_SIMD_BYTES 64
#include "codecs/codec_simd.h"

namespace cortado::dist::codec_internal {
namespace {

CORTADO_SIMD_INLINE __m256i Low256(__m512i v) { return _mm512_castsi512_si256(v); }

// ---- Packing tables ------------------------------------------------------------------------
// Encoding: 64 values' high parts H (bytes, in the order the packs leave them) and their planes
// P (plane p of group g in byte 8p + g) become 8 groups of 8 + L bytes: vpermt2b index i < 64
// takes H's byte i, 64 + i P's byte i. HighAt(v) is where value v's high part lies in H.
template <int L, class HighAt>
constexpr ByteTable GroupTable(int half, HighAt high_at) {
  return MakeTable([=](int i) {
    const int o = 64 * half + i, bytes = 8 + L;
    if (o >= 8 * bytes) return 0;
    const int g = o / bytes, r = o % bytes;
    return r < 8 ? high_at(8 * g + r) : 64 + 8 * (r - 8) + g;
  });
}
// epgc11: packus_epi16 of the words of values 0-31 and 32-63 interleaves 8-byte runs per lane.
constexpr int HighAt11(int v) {
  return v < 32 ? 16 * (v / 8) + v % 8 : 16 * ((v - 32) / 8) + 8 + v % 8;
}
// epgc9: packus_epi32 of (0-15, 16-31) and (32-47, 48-63), then packus_epi16 of the two: lane l
// holds 4 values of each of the four vectors in turn.
constexpr int HighAt9(int v) { return 16 * ((v % 16) / 4) + 4 * (v / 16) + v % 4; }
constexpr ByteTable kPack11[2] = {GroupTable<3>(0, HighAt11), GroupTable<3>(1, HighAt11)};
constexpr ByteTable kPack9[2] = {GroupTable<1>(0, HighAt9), GroupTable<1>(1, HighAt9)};

// Decoding epgc11, 32 values (4 groups, 44 bytes) per vector: word v's high byte is value v's
// high part; the low byte of word v gets plane p's byte, in which value v's bit is v % 8.
constexpr ByteTable kUnpack11High = MakeTable([](int i) { return 11 * (i / 16) + (i / 2) % 8; });
constexpr ByteTable Unpack11Plane(int p) {
  return MakeTable([p](int i) { return 11 * (i / 16) + 8 + p; });
}
constexpr ByteTable kUnpack11Plane[3] = {Unpack11Plane(0), Unpack11Plane(1), Unpack11Plane(2)};
constexpr ByteTable kUnpack11Bit = MakeTable([](int i) { return i % 2 ? 0 : 1 << ((i / 2) % 8); });
// Decoding epgc9, 64 values (72 bytes: 64 in one vector, 8 in another): the exponent bytes in
// order, and the 8 sign bytes.
constexpr ByteTable kUnpack9Exp = MakeTable([](int v) { return 9 * (v / 8) + v % 8; });
constexpr ByteTable kUnpack9Sign = MakeTable([](int g) { return g < 8 ? 9 * g + 8 : 0; });

// The constants of a format's loops (FormatConsts) and this set's own: the fixed-shift E5
// stochastic route's bounds (MagE5Stochastic), the f16 quiet bit.
template <int E, int M>
struct Consts : FormatConsts<E, M> {
  CORTADO_SIMD_INLINE Consts() {}

  __m512i normal_min = U32(113u << 23), rebias = U32(112u << 23);
  __m512i h_quiet = U16(0x0200);
  // Pack16's qword order after packus.
  __m512i pack_order = Keep(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7));
};

template <CodecKind K>
using ConstsOf = Consts<FormatOf(K).e, FormatOf(K).m>;

// Saturating to infinity and marking NaN: mag -> final magnitude.
template <int E, int M>
CORTADO_SIMD_INLINE __m512i Finish(const Consts<E, M>& k, __m512i mag, __m512i abs) {
  mag = _mm512_min_epu32(mag, k.inf);
  if constexpr (M > 0) {
    mag = _mm512_mask_or_epi32(mag, _mm512_cmpgt_epu32_mask(abs, k.exp_all), mag, k.qnan);
  }
  return mag;
}

// v + (a < b) and v + (a > b), as unsigned: masked adds.
template <class C>
CORTADO_SIMD_INLINE __m512i AddOneIfBelow(const C& k, __m512i v, __m512i a, __m512i b) {
  return _mm512_mask_add_epi32(v, _mm512_cmplt_epu32_mask(a, b), v, k.one);
}
template <class C>
CORTADO_SIMD_INLINE __m512i AddOneIfAbove(const C& k, __m512i v, __m512i a, __m512i b) {
  return AddOneIfBelow(k, v, b, a);
}

// Magnitude code of E5 formats, stochastic. Where every lane is normal in the target (fp32
// exponent 113 and up: NaN, infinity and overflow included, Finish saturates them), base + q of
// the reference is (abs - 112 << 23) >> s with s = 23 - M fixed, and the threshold abs << (32 -
// s), as for the E8 formats: half the work. Otherwise the integer formula of E5StochasticParts
// (codec_simd.h), per-lane s and all.
template <int M>
CORTADO_SIMD_INLINE __m512i MagE5Stochastic(const Consts<5, M>& k, __m512i u, __m512i r) {
  const __m512i abs = _mm512_and_si512(u, k.abs);
  if (_mm512_cmplt_epu32_mask(abs, k.normal_min) == 0) [[likely]] {
    const __m512i q = _mm512_srli_epi32(_mm512_sub_epi32(abs, k.rebias), 23 - M);
    return Finish(k, AddOneIfBelow(k, q, r, _mm512_slli_epi32(abs, 9 + M)), abs);
  }
  return MagE5StochasticFormula<M>(k, abs, r);
}

// Codes of 16 + 16 values of at most 16 bits -> 32 words in order.
template <class C>
CORTADO_SIMD_INLINE __m512i Pack16(const C& k, __m512i a, __m512i b) {
  return _mm512_permutexvar_epi64(k.pack_order, _mm512_packus_epi32(a, b));
}

// Sixteen f16 words of x by F16C with the format's fix-ups, as F16Words in codec_avx2.cpp:
// NaN -> sign | 0x7e00; kTruncate: infinity from 2^16 up; kOdd: toward zero with the lowest
// bit set where inexact (round to odd, rounded again by WordsToCodes).
enum class F16Mode { kNearest, kTruncate, kOdd };
template <F16Mode kMode, class C>
CORTADO_SIMD_INLINE __m256i F16Words(const C& k, __m512 x) {
  if constexpr (kMode == F16Mode::kTruncate) {
    const __mmask16 over =
        _mm512_cmp_ps_mask(Floats(_mm512_and_si512(Bits(x), k.abs)), k.f_two16, _CMP_GE_OQ);
    x = _mm512_mask_mov_ps(x, over,
                           Floats(_mm512_or_si512(_mm512_and_si512(Bits(x), k.sign), k.exp_all)));
  }
  constexpr int kRound =
      kMode == F16Mode::kNearest ? _MM_FROUND_TO_NEAREST_INT : _MM_FROUND_TO_ZERO;
  __m256i h = _mm512_cvtps_ph(x, kRound);
  if constexpr (kMode == F16Mode::kOdd) {
    const __mmask16 inexact = _mm512_cmp_ps_mask(_mm512_cvtph_ps(h), x, _CMP_NEQ_OQ);  // NaN: no
    h = _mm256_mask_mov_epi16(h, inexact, _mm256_or_si256(h, Low256(k.one16)));
  }
  // x is NaN exactly where h is (F16C keeps NaNs NaN, and makes none of other values).
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm256_mask_mov_epi16(h, nan, _mm256_andnot_si256(Low256(k.h_payload), h));
}

// The codes of 32 values (x0: 0-15, x1: 16-31) of an E5 format with M mantissa bits, in 16-bit
// words in order: F16C for nearest and truncate (round to odd, then integer rounding, for
// M < 10), the integer formula for stochastic.
template <int M, Rounding R, class C, class Stream>
CORTADO_SIMD_INLINE __m512i E5Codes(const C& k, __m512 x0, __m512 x1, Stream& random) {
  if constexpr (R == Rounding::kStochastic) {
    return E5StochasticCodes<M>(k, x0, x1, random);
  } else {
    constexpr bool kNearest = R == Rounding::kNearest;
    constexpr F16Mode kMode = M == 10 ? (kNearest ? F16Mode::kNearest : F16Mode::kTruncate)
                                      : (kNearest ? F16Mode::kOdd : F16Mode::kTruncate);
    __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(F16Words<kMode>(k, x0)),
                                   F16Words<kMode>(k, x1), 1);
    if constexpr (M < 10) {
      constexpr int s = 10 - M;
      if constexpr (kNearest) {
        // No carry reaches the sign: infinity's and the canonical NaN's words round to
        // themselves.
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi16(h, s), k.one16);
        h = _mm512_add_epi16(_mm512_add_epi16(h, k.half_m1_16), odd);
      }
      h = _mm512_srli_epi16(h, s);
    }
    return h;
  }
}

// residual += x - d where finite, else += +0 (a masked add would keep a -0 residual, where the
// portable kernels' + 0 makes it +0).
CORTADO_SIMD_INLINE void AddLoss(__m512 x, __m512 d, float* residual) {
  const __m512 diff = _mm512_sub_ps(x, d);
  const auto finite = static_cast<__mmask16>(~_mm512_fpclass_ps_mask(diff, 0x99));  // not NaN, inf
  _mm512_storeu_ps(residual,
                   _mm512_add_ps(_mm512_loadu_ps(residual), _mm512_maskz_mov_ps(finite, diff)));
}
// The residual of 32 values from their f16 words (values 0-15 in the low half).
CORTADO_SIMD_INLINE void AddLossWords(__m512 x0, __m512 x1, __m512i h, float* residual) {
  AddLoss(x0, _mm512_cvtph_ps(Low256(h)), residual);
  AddLoss(x1, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), residual + 16);
}

// The floats of 16 f16 words, as HalfToFloat: F16C quiets signalling NaNs (sets fp32 bit 22),
// which HalfToFloat keeps; NaN words are rare, so test for any first.
template <class C>
CORTADO_SIMD_INLINE __m512 HalvesToFloats(const C& k, __m256i h) {
  __m512 d = _mm512_cvtph_ps(h);
  const __mmask16 nan =
      _mm256_cmpgt_epu16_mask(_mm256_and_si256(h, Low256(k.h_abs)), Low256(k.h_inf));
  if (nan != 0) [[unlikely]] {
    const __mmask16 signalling = nan & ~_mm256_test_epi16_mask(h, Low256(k.h_quiet));
    d = Floats(_mm512_mask_xor_epi32(Bits(d), signalling, Bits(d), k.quiet));
  }
  return d;
}

// The floats of 32 f16 words, values 0-15 in the low half.
template <class C>
CORTADO_SIMD_INLINE void HalvesToFloats(const C& k, __m512i h, __m512& d0, __m512& d1) {
  d0 = HalvesToFloats(k, Low256(h));
  d1 = HalvesToFloats(k, _mm512_extracti64x4_epi64(h, 1));
}

// epgc11's groups back to f16 words (code << 5), 32 values (4 groups, 44 bytes) per vector:
// the high part into the high byte, the low part's bit p to bit 5 + p of the low byte (added:
// the bits are distinct, and AVX-512 has masked byte adds but no masked byte ORs).
struct Unpack11 {
  CORTADO_SIMD_INLINE Unpack11() {}
  __m512i high_index = Load(kUnpack11High), bit = Load(kUnpack11Bit);
  __m512i plane_index[3] = {Load(kUnpack11Plane[0]), Load(kUnpack11Plane[1]),
                            Load(kUnpack11Plane[2])};
  __m512i low_at[3] = {Load(kLowBitInWord[0]), Load(kLowBitInWord[1]), Load(kLowBitInWord[2])};

  CORTADO_SIMD_INLINE __m512i Words(__m512i v) const {
    __m512i h = _mm512_maskz_permutexvar_epi8(0xaaaaaaaaaaaaaaaaull, high_index, v);
#pragma GCC unroll 3
    for (int p = 0; p < 3; ++p) {
      const __mmask64 set = _mm512_test_epi8_mask(_mm512_permutexvar_epi8(plane_index[p], v), bit);
      h = _mm512_mask_add_epi8(h, set, h, low_at[p]);
    }
    return h;
  }
};

}  // namespace

// ---- Encode ---------------------------------------------------------------------------------

// Loops<Isa::kAvx512> (codec_dispatch.h): whole blocks from the start, as many as fit; returns
// how many values they held (a multiple of 32).
template <CodecKind K, Rounding R, bool kResidual>
CORTADO_SIMD_LOOP size_t EncodeLoopAvx512(const float* src, size_t count, uint8_t* dst,
                                          const EncodeOptions& o, float* residual) {
  constexpr int M = FormatOf(K).m;
  const ConstsOf<K> k;
  RandomStream<ConstsOf<K>> random(k, o.seed, o.first_index);
  size_t i = 0;
  if constexpr (K == CodecKind::kF16 || K == CodecKind::kBF16) {
    for (; i + 32 <= count; i += 32) {
      const __m512 x0 = _mm512_loadu_ps(src + i), x1 = _mm512_loadu_ps(src + i + 16);
      __m512i h;
      if constexpr (K == CodecKind::kF16) {
        h = E5Codes<10, R>(k, x0, x1, random);
        if constexpr (kResidual) AddLossWords(x0, x1, h, residual + i);
      } else {
        const __m512i c0 = WithSign(k, MagE8<7, R>(k, Bits(x0), Draw<R>(random)), Bits(x0));
        const __m512i c1 = WithSign(k, MagE8<7, R>(k, Bits(x1), Draw<R>(random)), Bits(x1));
        h = Pack16(k, c0, c1);
        if constexpr (kResidual) {
          AddLoss(x0, Floats(_mm512_slli_epi32(c0, 16)), residual + i);
          AddLoss(x1, Floats(_mm512_slli_epi32(c1, 16)), residual + i + 16);
        }
      }
      _mm512_storeu_si512(dst + 2 * i, h);
    }
  } else if constexpr (K == CodecKind::kEpgc8 || K == CodecKind::kEpgc11) {
    const __m512i table0 = Load((K == CodecKind::kEpgc11 ? kPack11 : kPack9)[0]);
    const __m512i table1 = Load((K == CodecKind::kEpgc11 ? kPack11 : kPack9)[1]);
    for (; i + 64 <= count; i += 64) {
      __m512 x[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) x[j] = _mm512_loadu_ps(src + i + 16 * j);
      // The codes in words: a holds values 0-31, b 32-63 (two statements: draws in order).
      const __m512i a = E5Codes<M, R>(k, x[0], x[1], random);
      const __m512i b = E5Codes<M, R>(k, x[2], x[3], random);
      if constexpr (K == CodecKind::kEpgc8) {
        _mm512_storeu_si512(dst + i,
                            _mm512_permutexvar_epi64(k.pack_order, _mm512_packus_epi16(a, b)));
        if constexpr (kResidual) {  // a code is the top byte of an f16 word
          AddLossWords(x[0], x[1], _mm512_slli_epi16(a, 8), residual + i);
          AddLossWords(x[2], x[3], _mm512_slli_epi16(b, 8), residual + i + 32);
        }
      } else {
        // High parts (code >> 3) as bytes; plane p = bit p of every code, one mask bit per
        // value, in order; then both into the 88 bytes of 8 groups.
        const __m512i high = _mm512_packus_epi16(_mm512_srli_epi16(a, 3), _mm512_srli_epi16(b, 3));
        uint64_t plane[3];
#pragma GCC unroll 3
        for (int p = 0; p < 3; ++p) {
          const __m512i bit = _mm512_slli_epi16(k.one16, p);
          plane[p] = _cvtmask64_u64(
              _mm512_kunpackd(_mm512_test_epi16_mask(b, bit), _mm512_test_epi16_mask(a, bit)));
        }
        const __m512i planes = _mm512_inserti32x4(
            _mm512_castsi128_si512(
                _mm_set_epi64x(static_cast<long long>(plane[1]), static_cast<long long>(plane[0]))),
            _mm_cvtsi64_si128(static_cast<long long>(plane[2])), 1);
        uint8_t* out = dst + i / 8 * 11;
        _mm512_storeu_si512(out, _mm512_permutex2var_epi8(high, table0, planes));
        _mm512_mask_storeu_epi8(out + 64, 0xffffffu,
                                _mm512_permutex2var_epi8(high, table1, planes));
        if constexpr (kResidual) {  // the f16 words are code << 5
          AddLossWords(x[0], x[1], _mm512_slli_epi16(a, 5), residual + i);
          AddLossWords(x[2], x[3], _mm512_slli_epi16(b, 5), residual + i + 32);
        }
      }
    }
  } else if constexpr (K == CodecKind::kEpgc9) {
    const __m512i table0 = Load(kPack9[0]), table1 = Load(kPack9[1]);
    for (; i + 64 <= count; i += 64) {
      __m512 x[4];
      __m512i m[4];  // the exponent bytes (the magnitude codes)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) x[j] = _mm512_loadu_ps(src + i + 16 * j);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) m[j] = MagE8<0, R>(k, Bits(x[j]), Draw<R>(random));
      const __m512i high =
          _mm512_packus_epi16(_mm512_packus_epi32(m[0], m[1]), _mm512_packus_epi32(m[2], m[3]));
      uint64_t signs = 0;  // the sign plane: bit v = value v's sign
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        signs |= uint64_t{_mm512_movepi32_mask(Bits(x[j]))} << 16 * j;
      }
      const __m512i planes =
          _mm512_castsi128_si512(_mm_cvtsi64_si128(static_cast<long long>(signs)));
      uint8_t* out = dst + i / 8 * 9;
      _mm512_storeu_si512(out, _mm512_permutex2var_epi8(high, table0, planes));
      _mm512_mask_storeu_epi8(out + 64, 0xffu, _mm512_permutex2var_epi8(high, table1, planes));
      if constexpr (kResidual) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m512i d =
              _mm512_or_si512(_mm512_and_si512(Bits(x[j]), k.sign), _mm512_slli_epi32(m[j], 23));
          AddLoss(x[j], Floats(d), residual + i + 16 * j);
        }
      }
    }
  }
  return i;
}

// ---- Decode ---------------------------------------------------------------------------------

// Loops<Isa::kAvx512> (codec_dispatch.h), as Encode, for the packed formats (the others:
// DecodeWideningLoop, codec_simd.h).
template <CodecKind K, bool kAccumulate>
CORTADO_SIMD_LOOP size_t DecodeLoopAvx512(const uint8_t* src, size_t count, float* dst) {
  // The loop's constants: a format's unused ones cost nothing (Keep's empty asm goes with them).
  const ConstsOf<K> k;
  const Unpack11 u;
  const __m512i exp_index = Load(kUnpack9Exp), sign_index = Load(kUnpack9Sign);
  size_t i = 0;
  if constexpr (K == CodecKind::kEpgc11) {
    for (; i + 64 <= count; i += 64) {
      const uint8_t* in = src + i / 8 * 11;
      const __m512i a = u.Words(_mm512_loadu_si512(in));
      const __m512i b = u.Words(_mm512_maskz_loadu_epi8((uint64_t{1} << 44) - 1, in + 44));
      __m512 d[4];
      HalvesToFloats(k, a, d[0], d[1]);
      HalvesToFloats(k, b, d[2], d[3]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) Put<kAccumulate>(dst + i + 16 * j, d[j]);
    }
  } else if constexpr (K == CodecKind::kEpgc9) {
    for (; i + 64 <= count; i += 64) {
      // 72 bytes: the exponent bytes in order, and the sign plane as a mask of 64 bits.
      const uint8_t* in = src + i / 8 * 9;
      const __m512i v0 = _mm512_loadu_si512(in), v1 = _mm512_maskz_loadu_epi8(0xffu, in + 64);
      const __m512i exps = _mm512_permutex2var_epi8(v0, exp_index, v1);
      const uint64_t signs = static_cast<uint64_t>(
          _mm_cvtsi128_si64(_mm512_castsi512_si128(_mm512_permutex2var_epi8(v0, sign_index, v1))));
      const __m128i e8[4] = {_mm512_castsi512_si128(exps), _mm512_extracti32x4_epi32(exps, 1),
                             _mm512_extracti32x4_epi32(exps, 2),
                             _mm512_extracti32x4_epi32(exps, 3)};
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i e = _mm512_slli_epi32(_mm512_cvtepu8_epi32(e8[j]), 23);
        const auto neg = static_cast<__mmask16>(signs >> 16 * j);
        Put<kAccumulate>(dst + i + 16 * j, Floats(_mm512_mask_or_epi32(e, neg, e, k.sign)));
      }
    }
  } else {
    static_assert(K == CodecKind::kEpgc8, "f32, f16, bf16: DecodeWideningLoop");
    for (; i + 32 <= count; i += 32) {
      // Each byte becomes the top byte of an f16 word.
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      const __m512i h = _mm512_slli_epi16(_mm512_cvtepu8_epi16(bytes), 8);
      __m512 d0, d1;
      HalvesToFloats(k, h, d0, d1);
      Put<kAccumulate>(dst + i, d0);
      Put<kAccumulate>(dst + i + 16, d1);
    }
  }
  return i;
}

CORTADO_SIMD_KERNEL_SET(Isa::kAvx512, EncodeLoopAvx512, DecodeLoopAvx512);

}  // namespace cortado::dist::codec_internal

#endif  // CORTADO_CODEC_HAVE_AVX512
