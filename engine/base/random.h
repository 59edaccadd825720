// Random numbers that make runs reproducible and resumable.
//
// Rng (xoshiro256**) is a seeded stream for parameter initialization. Everything that draws
// randomness during training (shuffles, flips, crops, dropout masks) uses counter-based
// values instead: a hash of (seed, stream, counter). Such values depend only on where the run
// is (epoch, iteration, index), so a resumed run draws exactly what an uninterrupted one does
// without saving generator state, and any thread can draw any element in any order.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/base/counter_hash.h"  // Mix64, HashCombine, KeyToUniform (host and device)

namespace cortado {

// FNV-1a of a string, for deriving per-layer seeds from layer names.
inline uint64_t HashString(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  double Uniform();                      // [0, 1)
  double Uniform(double lo, double hi);  // [lo, hi)
  double Normal(double mean, double stddev);
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n);

 private:
  uint64_t s_[4];
};

}  // namespace cortado
