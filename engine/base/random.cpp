#include "engine/base/random.h"

#include <cmath>

namespace cortado {

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : s_) {
    x = Mix64(x);
    s = x;
  }
}

uint64_t Rng::Next() {
  auto rotl = [](uint64_t v, int k) { return (v << k) | (v >> (64 - k)); };
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }

double Rng::Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }

double Rng::Normal(double mean, double stddev) {
  // Box-Muller; u1 in (0, 1] so the log is finite.
  double u1 = 1.0 - Uniform();
  double u2 = Uniform();
  return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

uint64_t Rng::Below(uint64_t n) {
  if (n <= 1) return 0;
  // Rejection sampling removes modulo bias.
  uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % n);
  uint64_t v;
  do v = Next();
  while (v >= limit);
  return v % n;
}

}  // namespace cortado
