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

namespace cortado {

// SplitMix64 finalizer: a bijective 64-bit mix with good avalanche.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Combines values into one 64-bit key: HashCombine(HashCombine(seed, epoch), index).
inline uint64_t HashCombine(uint64_t a, uint64_t b) { return Mix64(a ^ Mix64(b)); }

// FNV-1a of a string, for deriving per-layer seeds from layer names.
inline uint64_t HashString(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// A uniform double in [0, 1) from a 64-bit key (53 random bits).
inline double KeyToUniform(uint64_t key) {
  return static_cast<double>(Mix64(key) >> 11) * (1.0 / 9007199254740992.0);
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
