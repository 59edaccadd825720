// Internal: the parts of the vector kernel sets (codec_avx2.cpp, codec_avx512.cpp) that differ
// only in vector width, written once. A set's file defines CORTADO_SIMD_TARGET (its target
// attribute's string) and CORTADO_SIMD_BYTES (its vector width: 32 or 64) and includes this
// header, which gives it:
//   - CORTADO_SIMD_INLINE (helpers: inlined into their callers, a few instructions each) and
//     CORTADO_SIMD_LOOP (loops: each a function of its own; inlined into the dispatch they would
//     share one huge function's register allocation), both with the target attribute, so the
//     set is built whatever -march says and runs only where ActiveIsa() found the CPU able;
//   - VecI and VecF, its integer and float vectors, and CORTADO_SIMD_FN(op), the intrinsic
//     _mm256_op or _mm512_op, for the operations both widths name alike;
//   - the helpers below. They use GCC's vector extensions (operators on vector types) where an
//     operator says it: GCC's own intrinsic headers are made of them (_mm256_xor_si256 is
//     a ^ b, _mm512_mullo_epi32 a * b on 32-bit lanes), so they compile to the same instructions.
// Everything is in an anonymous namespace, once per translation unit: the two sets' copies,
// built for different targets, never meet.
#pragma once

#if !defined(CORTADO_SIMD_TARGET) || !defined(CORTADO_SIMD_BYTES)
#error "codec_simd.h: define CORTADO_SIMD_TARGET and CORTADO_SIMD_BYTES before including it"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "codecs/codec_dispatch.h"
#include "codecs/codec_internal.h"
#include "codecs/codec_tables.h"

#define CORTADO_SIMD_INLINE \
  __attribute__((target(CORTADO_SIMD_TARGET))) __attribute__((always_inline)) inline
#define CORTADO_SIMD_LOOP __attribute__((target(CORTADO_SIMD_TARGET))) __attribute__((noinline))

// Written once in each set's file, after its loops and ConstsOf: Loops<kIsa>'s members
// (codec_dispatch.h) forward to them, or to DecodeWideningLoop for the formats it decodes, and
// the set's EncodeSet and DecodeSet are instantiated. The loops are free function
// templates <K, R, kResidual> and <K, kAccumulate> carrying the set's target attribute: GCC drops
// one written on the definition of a member template's specialization, which without
// -march=native would leave their intrinsics outside the ISA they need.
#define CORTADO_SIMD_KERNEL_SET(kIsa, EncodeLoop, DecodeLoop)                                      \
  template <>                                                                                      \
  template <CodecKind K, Rounding R, bool kResidual>                                               \
  size_t Loops<kIsa>::Encode(const float* src, size_t count, uint8_t* dst, const EncodeOptions& o, \
                             float* residual) {                                                    \
    return EncodeLoop<K, R, kResidual>(src, count, dst, o, residual);                              \
  }                                                                                                \
  template <>                                                                                      \
  template <CodecKind K, bool kAccumulate>                                                         \
  size_t Loops<kIsa>::Decode(const uint8_t* src, size_t count, float* dst) {                       \
    if constexpr (K == CodecKind::kF32 || K == CodecKind::kF16 || K == CodecKind::kBF16) {         \
      return DecodeWideningLoop<ConstsOf<K>, K, kAccumulate>(src, count, dst);                     \
    } else {                                                                                       \
      return DecodeLoop<K, kAccumulate>(src, count, dst);                                          \
    }                                                                                              \
  }                                                                                                \
  template void EncodeSet<kIsa>(CodecKind, const float*, size_t, uint8_t*, const EncodeOptions&,   \
                                float*);                                                           \
  template void DecodeSet<kIsa>(CodecKind, const uint8_t*, size_t, float*, bool)

namespace cortado::dist::codec_internal {
namespace {

#if CORTADO_SIMD_BYTES == 32
using VecI = __m256i;
using VecF = __m256;
using HalfI = __m128i;  // half a vector: a vector's lanes in 16 bits
#define CORTADO_SIMD_FN(op) _mm256_##op
#elif CORTADO_SIMD_BYTES == 64
using VecI = __m512i;
using VecF = __m512;
using HalfI = __m256i;
#define CORTADO_SIMD_FN(op) _mm512_##op
#else
#error "codec_simd.h: CORTADO_SIMD_BYTES must be 32 or 64"
#endif

// 32-bit lanes per vector.
constexpr int kLanes = sizeof(VecI) / 4;
// VecI seen as 32-bit lanes, for the operators (VecI itself is 64-bit lanes).
typedef uint32_t U32s __attribute__((vector_size(sizeof(VecI))));
typedef uint16_t U16s __attribute__((vector_size(sizeof(VecI))));

CORTADO_SIMD_INLINE VecI Bits(VecF x) { return VecI(x); }
CORTADO_SIMD_INLINE VecF Floats(VecI u) { return VecF(u); }

// A value the compiler must treat as unknown. The loops' constants pass through it once, before
// the loop: GCC 12 otherwise rebuilds a constant vector at each use inside a loop under
// register pressure (mov, vmovd, vpbroadcastd: three instructions), where an unknown value is
// kept in a register or reloaded from the stack as an operand. It halved stochastic encoding.
template <class V>
CORTADO_SIMD_INLINE V Keep(V v) {
  __asm__("" : "+v"(v));
  return v;
}
// Every 32-bit (U32) or 16-bit (U16) lane `v`, kept.
CORTADO_SIMD_INLINE VecI U32(uint32_t v) { return Keep(VecI(U32s{} + v)); }
CORTADO_SIMD_INLINE VecI U16(uint16_t v) { return Keep(VecI(U16s{} + v)); }

// The first sizeof(VecI) bytes of a table (codec_tables.h), kept.
CORTADO_SIMD_INLINE VecI Load(const ByteTable& t) {
  return Keep(*reinterpret_cast<const VecI*>(t.b));
}
CORTADO_SIMD_INLINE VecI Load(const WordTable& t) {
  return Keep(*reinterpret_cast<const VecI*>(t.w));
}

// A vector from memory at any alignment.
template <class V>
CORTADO_SIMD_INLINE V LoadU(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The constants both sets' loops use, of a format (E exponent, M mantissa bits): made once per
// call, before the loop (a loop's unused ones cost nothing: Keep's empty asm goes with its
// result). Each set's Consts<E, M> adds its own.
template <int E, int M>
struct FormatConsts {
  // Declared, so that the member initializers below run with the target attribute.
  CORTADO_SIMD_INLINE FormatConsts() {}

  static constexpr uint32_t kInf = ((1u << E) - 1) << M;
  VecI one = U32(1), abs = U32(0x7fffffffu), sign = U32(0x80000000u);
  VecI exp_all = U32(0x7f800000u), implicit = U32(0x800000u);
  VecI inf = U32(kInf), qnan = U32(M > 0 ? 1u << (M > 0 ? M - 1 : 0) : 0u);
  VecF f_two16 = Floats(U32(0x47800000u));  // 2^16
  // E5 stochastic (E5StochasticParts): the exponent of the smallest normal target, bases, shifts.
  VecI e113 = U32(113), base_off = U32(113u << M), s_off = U32(23 - M);
  VecI s_max = U32(40), c32 = U32(32);
  // The hash (RandomStream): lane j's index multiplier, a block's step, fmix32's multipliers.
  VecI hash_lanes = Load(kHashLanes);
  VecI hash_step = U32(kLanes * kHashLo), mix1 = U32(kMix1), mix2 = U32(kMix2);
  // f16 words: magnitude mask, infinity, what a NaN loses of its payload (all but the quiet
  // bit); 1 and half an ulp of the format less 1, for rounding words; fp32's quiet bit.
  VecI h_abs = U16(0x7fff), h_inf = U16(0x7c00), h_payload = U16(0x01ff);
  VecI one16 = U16(1), half_m1_16 = U16(M < 10 ? (1u << (M < 10 ? 9 - M : 0)) - 1 : 0);
  VecI quiet = U32(0x400000u);
};

// StochasticBits(seed, index + j) for consecutive blocks of kLanes (lane j): the lower index
// word's product advances by kLanes * kHashLo per block (k.hash_step); the upper word's part
// (key) is constant until the lower word wraps. A block reaching the wrap goes the scalar way.
template <class C>
struct RandomStream {
  const C& k;
  uint64_t seed, index;
  U32s next, key;

  CORTADO_SIMD_INLINE RandomStream(const C& consts, uint64_t s, uint64_t first)
      : k(consts), seed(s), index(first) {
    Restart();
  }
  CORTADO_SIMD_INLINE void Restart() {
    next = HashBase(seed, index) + U32s(k.hash_lanes);
    key = U32s{} + HashKey(seed, index);
  }
  CORTADO_SIMD_INLINE VecI Next() {
    if (BlockReachesWrap(index, kLanes)) [[unlikely]] {
      U32s r;
      for (int j = 0; j < kLanes; ++j) r[j] = StochasticBits(seed, index + j);
      index += kLanes;
      Restart();
      return VecI(r);
    }
    U32s h = next ^ key;  // then Fmix32, lane-wise
    next += U32s(k.hash_step);
    index += kLanes;
    h ^= h >> 16;
    h *= U32s(k.mix1);
    h ^= h >> 13;
    h *= U32s(k.mix2);
    return VecI(h ^ (h >> 16));
  }
};

// The random words of the next block, or nothing where the rounding draws none.
template <Rounding R, class Stream>
CORTADO_SIMD_INLINE VecI Draw(Stream& stream) {
  if constexpr (R == Rounding::kStochastic) {
    return stream.Next();
  } else {
    return VecI{};
  }
}

// The code: magnitude | the sign of fp32 bits u moved to bit E + M.
template <template <int, int> class C, int E, int M>
CORTADO_SIMD_INLINE VecI WithSign(const C<E, M>& k, VecI mag, VecI u) {
  return VecI(U32s(mag) | ((U32s(u) & U32s(k.sign)) >> (31 - E - M)));
}

// The E5 formats' (bias 15) stochastic rounding of magnitudes abs by the reference's integer
// formula: sig = the significand with its implicit bit, et = max(exponent, 113) (x is normal in
// the target from fp32 exponent 113 on), s = the bits below the target's ulp (more than 23 - M
// where the target is subnormal, capped at 40). Gives base_q, the code rounded down (base + q,
// before Finish), and threshold, the remainder's bits at the top of a word: a draw r below it
// rounds up.
template <int M, class C>
CORTADO_SIMD_INLINE void E5StochasticParts(const C& k, VecI abs, VecI& base_q, VecI& threshold) {
  const VecI ef = CORTADO_SIMD_FN(srli_epi32)(abs, 23);
  const VecI e1 = CORTADO_SIMD_FN(max_epi32)(ef, k.one);
  // abs - (e1 - 1) << 23: the implicit bit for normal fp32, the bare mantissa for subnormal.
  const VecI sig = VecI(U32s(abs) + U32s(k.implicit) - U32s(CORTADO_SIMD_FN(slli_epi32)(e1, 23)));
  const VecI et = CORTADO_SIMD_FN(max_epi32)(ef, k.e113);
  const U32s base = U32s(CORTADO_SIMD_FN(slli_epi32)(et, M)) - U32s(k.base_off);
  const VecI s = CORTADO_SIMD_FN(min_epi32)(VecI(U32s(et) - U32s(e1) + U32s(k.s_off)), k.s_max);
  base_q = VecI(base + U32s(CORTADO_SIMD_FN(srlv_epi32)(sig, s)));
  // rem << (32 - s) for s <= 32 is sig << (32 - s) in 32 bits (q's bits shift out); rem >>
  // (s - 32) above is sig >> (s - 32) (q = 0). The other shift's count is "negative", i.e.
  // >= 32 unsigned, and gives 0 (the variable shifts of both widths do).
  const VecI up = CORTADO_SIMD_FN(sllv_epi32)(sig, VecI(U32s(k.c32) - U32s(s)));
  const VecI down = CORTADO_SIMD_FN(srlv_epi32)(sig, VecI(U32s(s) - U32s(k.c32)));
  threshold = VecI(U32s(up) | U32s(down));
}

// The set gives, for the functions below (found where they are instantiated, by the type of the
// constants k): Finish(k, mag, abs), saturating mag to infinity and marking NaN;
// AddOneIfBelow(k, v, a, b), v + (a < b) as unsigned; AddOneIfAbove(k, v, a, b), v + (a > b) for
// a and b below 2^31.

// Magnitude code (no sign) of E8 formats (bf16, epgc9): base + q of the reference is abs >> s.
template <int M, Rounding R, class C>
CORTADO_SIMD_INLINE VecI MagE8(const C& k, VecI u, VecI r) {
  constexpr int s = 23 - M;
  const VecI abs = VecI(U32s(u) & U32s(k.abs));
  const VecI q = CORTADO_SIMD_FN(srli_epi32)(abs, s);
  if constexpr (R == Rounding::kTruncate) {
    return Finish(k, q, abs);
  } else if constexpr (R == Rounding::kStochastic) {
    return Finish(k, AddOneIfBelow(k, q, r, CORTADO_SIMD_FN(slli_epi32)(abs, 32 - s)), abs);
  } else {
    // (abs + half - 1 + (q odd)) >> s: q's low bit is abs's bit s, or for epgc9 (q = the
    // implicit bit) whether x is normal, above 0x7fffff.
    const VecI half_m1 = CORTADO_SIMD_FN(srli_epi32)(k.abs, 32 - s);  // 2^(s-1) - 1
    VecI t = VecI(U32s(abs) + U32s(half_m1));
    if constexpr (M > 0) {
      t = VecI(U32s(t) + (U32s(q) & U32s(k.one)));
    } else {
      t = AddOneIfAbove(k, t, abs, CORTADO_SIMD_FN(srli_epi32)(k.abs, 8));
    }
    return Finish(k, CORTADO_SIMD_FN(srli_epi32)(t, s), abs);
  }
}

// Magnitude code (no sign) of E5 formats, stochastic, by the integer formula, per lane.
template <int M, class C>
CORTADO_SIMD_INLINE VecI MagE5StochasticFormula(const C& k, VecI abs, VecI r) {
  VecI base_q, threshold;
  E5StochasticParts<M>(k, abs, base_q, threshold);
  return Finish(k, AddOneIfBelow(k, base_q, r, threshold), abs);
}

// The codes of 2 * kLanes values of an E5 format, stochastic, in 16-bit words in order: the
// set's MagE5Stochastic per vector, packed by its Pack16(k, a, b).
template <int M, class C, class Stream>
CORTADO_SIMD_INLINE VecI E5StochasticCodes(const C& k, VecF x0, VecF x1, Stream& random) {
  // Two statements: the draws must be taken in order.
  const VecI c0 = WithSign(k, MagE5Stochastic<M>(k, Bits(x0), random.Next()), Bits(x0));
  const VecI c1 = WithSign(k, MagE5Stochastic<M>(k, Bits(x1), random.Next()), Bits(x1));
  return Pack16(k, c0, c1);
}

// dst = d, or dst += d where kAccumulate, at any alignment.
template <bool kAccumulate>
CORTADO_SIMD_INLINE void Put(float* dst, VecF d) {
  if constexpr (kAccumulate) d = LoadU<VecF>(dst) + d;
  std::memcpy(dst, &d, sizeof d);
}

// The decoding loops of the formats that widen words to floats (f32, only ever asked to
// accumulate: a copy otherwise; f16, through the set's HalvesToFloats(k, words, d0, d1): 2 *
// kLanes f16 words exactly, NaN payloads included; bf16), whole blocks from the start; returns
// how many values they held. C: the set's constants for K.
template <class C, CodecKind K, bool kAccumulate>
CORTADO_SIMD_LOOP size_t DecodeWideningLoop(const uint8_t* src, size_t count, float* dst) {
  size_t i = 0;
  if constexpr (K == CodecKind::kF32) {
    for (; i + kLanes <= count; i += kLanes) Put<kAccumulate>(dst + i, LoadU<VecF>(src + 4 * i));
  } else if constexpr (K == CodecKind::kF16) {
    const C k;
    for (; i + 2 * kLanes <= count; i += 2 * kLanes) {
      VecF d0, d1;
      HalvesToFloats(k, LoadU<VecI>(src + 2 * i), d0, d1);
      Put<kAccumulate>(dst + i, d0);
      Put<kAccumulate>(dst + i + kLanes, d1);
    }
  } else {
    static_assert(K == CodecKind::kBF16);
    for (; i + 2 * kLanes <= count; i += 2 * kLanes) {
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const VecI w = CORTADO_SIMD_FN(cvtepu16_epi32)(LoadU<HalfI>(src + 2 * (i + kLanes * j)));
        Put<kAccumulate>(dst + i + kLanes * j, Floats(CORTADO_SIMD_FN(slli_epi32)(w, 16)));
      }
    }
  }
  return i;
}

}  // namespace
}  // namespace cortado::dist::codec_internal
