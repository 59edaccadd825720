// Internal: the UCX transport's Wait loop decides, after each progress call that moved nothing,
// whether to poll again, yield the core and poll, or sleep on the worker's event fd. WaitPacer is
// that decision and its state for one wait, without UCX types or a clock of its own (the caller
// passes the time), so it is table-tested on the host. One per wait, on the waiting thread.
//
// The rule:
//   - A progress call that moved something starts a new idle run: the sleep goes back to 1 ms.
//   - In an idle run the first kClockFreePolls polls skip the clock (a reply on an idle core comes
//     within a few of them, and a clock read costs as much as a poll); then every 16th reads it,
//     and the first read starts the run's spin window.
//   - Inside the window, while the wait has not slept, it polls (CORTADO_SPIN_US, when
//     SpinPolicy lets this wait spin): a reply on an idle core comes in microseconds, far sooner
//     than a wake-up. After kBusyPollUs it yields between polls in case the peer shares the core.
//   - Otherwise it sleeps, 1 ms doubling to kMaxSleepMs while nothing happens (not every UCX
//     transport signals the fd for every step, so a missed wake-up costs at most one sleep).
//   - A sleep that returned at once, because events were pending when the worker was armed, did
//     not sleep: it neither ends this wait's polling nor doubles the sleep, and the wait still
//     counts as a hit for SpinPolicy if it completes without a real sleep.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "cortado/dist/deadline.h"

namespace cortado::dist::ucx {

class WaitPacer {
 public:
  static constexpr uint64_t kClockFreePolls = 64;
  static_assert(kClockFreePolls % 16 == 0, "the clock is read on every 16th idle poll");
  static constexpr std::chrono::microseconds kBusyPollUs{10};
  static constexpr int kMaxSleepMs = 50;

  enum class Next { kPoll, kYieldAndPoll, kSleep };

  // spin: how long an idle run polls before it sleeps (zero: it never polls).
  explicit WaitPacer(std::chrono::microseconds spin) : spin_(spin) {}

  // A progress call moved something.
  void Moved() {
    idle_ = 0;
    sleep_ms_ = 1;
  }
  // A progress call moved nothing: true when the caller must read the clock and call Decide.
  bool ClockDue() {
    ++idle_;
    return idle_ >= kClockFreePolls && (idle_ & 15) == 0;
  }
  // What to do next, at time `now` (read because ClockDue said so).
  Next Decide(Clock::time_point now) {
    if (idle_ == kClockFreePolls) window_start_ = now;
    const auto in_window = now - window_start_;
    if (spin_.count() > 0 && !slept_ && in_window < spin_) {
      polled_ = true;
      return in_window > kBusyPollUs ? Next::kYieldAndPoll : Next::kPoll;
    }
    return Next::kSleep;
  }
  // How long the next sleep may last.
  int sleep_ms() const { return sleep_ms_; }
  // After Decide said kSleep: `waited` is false when the sleep returned at once (events were
  // pending when the worker was armed), true when it waited on the fd.
  void Slept(bool waited) {
    if (!waited) return;
    slept_ = true;
    sleep_ms_ = std::min(2 * sleep_ms_, kMaxSleepMs);
  }

  // For SpinPolicy: whether the wait polled, and whether it then really slept.
  bool polled() const { return polled_; }
  bool slept() const { return slept_; }

 private:
  std::chrono::microseconds spin_;
  uint64_t idle_ = 0;  // progress calls since the last that moved something
  Clock::time_point window_start_{};
  int sleep_ms_ = 1;
  bool polled_ = false;
  bool slept_ = false;
};

}  // namespace cortado::dist::ucx
