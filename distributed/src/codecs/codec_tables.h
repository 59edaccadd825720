// Internal: the constant tables of the vector kernel sets (codec_avx2.cpp, codec_avx512.cpp),
// made at compile time. A table is 64 bytes, aligned for one AVX-512 load; the AVX2 set loads
// its first 32 bytes. The tables both sets use are here; each set keeps its own permutes beside
// the loops that use them.
#pragma once

#include <cstdint>

#include "codecs/codec_internal.h"

namespace cortado::dist::codec_internal {

struct alignas(64) ByteTable {
  uint8_t b[64];
};
template <class F>
constexpr ByteTable MakeTable(F f) {
  ByteTable t{};
  for (int i = 0; i < 64; ++i) t.b[i] = static_cast<uint8_t>(f(i));
  return t;
}

// Every byte `value`.
constexpr ByteTable Splat(int value) {
  return MakeTable([value](int) { return value; });
}

struct alignas(64) WordTable {
  uint32_t w[16];
};

// Byte i holds bit i % 8: in 8 bytes standing for 8 values, value j's bit of a plane byte.
constexpr ByteTable kBitOfByte = MakeTable([](int i) { return 1 << (i % 8); });

// epgc11 decoded to f16 words (code << 5): the low part's bit p lands on bit 5 + p of the word's
// low byte; set where plane p has the value's bit.
constexpr ByteTable kLowBitInWord[3] = {Splat(0x20), Splat(0x40), Splat(0x80)};

// Lane j's part of the stochastic hash of index + j (StochasticBits): j * kHashLo, added to the
// block's HashBase.
constexpr WordTable kHashLanes = [] {
  WordTable t{};
  for (uint32_t j = 0; j < 16; ++j) t.w[j] = j * kHashLo;
  return t;
}();

}  // namespace cortado::dist::codec_internal
