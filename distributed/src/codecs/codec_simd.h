// Internal: the parts of the vector kernel sets (codec_avx2.cpp, codec_avx512.cpp) that differ
// only in vector width, written once. They use GCC's vector extensions (operators on vector
// types), which are what GCC's own intrinsic headers are made of: _mm256_xor_si256 is a ^ b,
// _mm512_mullo_epi32 a * b on 32-bit lanes, so these compile to the instructions the intrinsics
// did. A set's file includes this header after defining, in its anonymous namespace inside
// cortado::dist::codec_internal, its vector types VecI (integer) and VecF (float), and the macro
// CORTADO_SIMD_INLINE (its target attribute with always_inline): every function here is then
// built for that set's ISA and inlines into its loops. Defined once per translation unit, in an
// anonymous namespace, so the two sets' copies never meet.
#pragma once

#ifndef CORTADO_SIMD_INLINE
#error "codec_simd.h: define CORTADO_SIMD_INLINE, VecI and VecF before including it"
#endif

#include <cstdint>
#include <cstring>

#include "codecs/codec_internal.h"
#include "codecs/codec_tables.h"

namespace cortado::dist::codec_internal {
namespace {

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

// dst = d, or dst += d where kAccumulate, at any alignment.
template <bool kAccumulate>
CORTADO_SIMD_INLINE void Put(float* dst, VecF d) {
  if constexpr (kAccumulate) d = LoadU<VecF>(dst) + d;
  std::memcpy(dst, &d, sizeof d);
}

// Decoding f32 (only ever asked to accumulate: a copy otherwise), whole vectors from the start;
// returns how many values they held.
template <bool kAccumulate>
CORTADO_SIMD_INLINE size_t DecodeF32Loop(const uint8_t* src, size_t count, float* dst) {
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) Put<kAccumulate>(dst + i, LoadU<VecF>(src + 4 * i));
  return i;
}

}  // namespace
}  // namespace cortado::dist::codec_internal
