// A point in time after which an operation gives up, on the monotonic clock. Every blocking call
// in the library takes one, so nothing can wait forever.
#pragma once

#include <chrono>
#include <cstdint>

namespace cortado::dist {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  static Deadline After(std::chrono::nanoseconds d) { return Deadline(Clock::now() + d); }
  static Deadline Never() { return Deadline(Clock::time_point::max()); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  Clock::time_point at() const { return at_; }
  bool Expired() const { return at_ != Clock::time_point::max() && Clock::now() >= at_; }
  bool IsNever() const { return at_ == Clock::time_point::max(); }
  // Milliseconds left, clamped to [0, cap]; for poll()-style timeouts.
  int RemainingMs(int cap = 1 << 30) const {
    if (IsNever()) return cap;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left < 0) return 0;
    return left > cap ? cap : static_cast<int>(left) + 1;
  }
  Deadline Earlier(Deadline other) const { return other.at_ < at_ ? other : *this; }

 private:
  Clock::time_point at_;
};

}  // namespace cortado::dist
