// The counter-based hash behind every random draw of training (engine/base/random.h), written
// once for host and device code: a dropout mask drawn in a CUDA kernel or on the test device is
// bit for bit the CPU's, since both compile these same integer functions.
#pragma once

#include <cstdint>

#include "cortado/dist/half.h"  // CORTADO_HOST_DEVICE

namespace cortado {

// SplitMix64 finalizer: a bijective 64-bit mix with good avalanche.
CORTADO_HOST_DEVICE uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Combines values into one 64-bit key: HashCombine(HashCombine(seed, epoch), index).
CORTADO_HOST_DEVICE uint64_t HashCombine(uint64_t a, uint64_t b) { return Mix64(a ^ Mix64(b)); }

// A uniform double in [0, 1) from a 64-bit key (53 random bits; exact in double, so the same on
// any device).
CORTADO_HOST_DEVICE double KeyToUniform(uint64_t key) {
  return static_cast<double>(Mix64(key) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace cortado
