// The UCX transport's wait loop, as a table (transport/ucx/wait_pacer.h, needs no UCX): after each
// idle progress call, poll, yield and poll, or sleep, at times the test chooses; what a sleep that
// returned at once (events pending when the worker was armed) changes; and what the wait reports
// to SpinPolicy.
#include <gtest/gtest.h>

#include <vector>

#include "transport/ucx/wait_pacer.h"

namespace cortado::dist::ucx {
namespace {

using Next = WaitPacer::Next;
using std::chrono::microseconds;

// One clock read of a wait: `moved` starts a new idle run first (a progress call moved
// something); then idle progress calls until the clock is due, at `at_us`. `want` is the
// decision; when it is kSleep, `waited` is what Sleep answered, and `sleep_ms` is the next
// sleep's length afterwards.
struct Tick {
  bool moved;
  int at_us;
  Next want;
  bool waited = true;
  int sleep_ms = 1;
};

struct Case {
  const char* name;
  int spin_us;
  std::vector<Tick> ticks;
  bool polled;  // what the wait reports to SpinPolicy: it polled, and
  bool slept;   // it then really slept (a miss)
};

const char* Name(Next n) {
  switch (n) {
    case Next::kPoll:
      return "poll";
    case Next::kYieldAndPoll:
      return "yield and poll";
    case Next::kSleep:
      return "sleep";
  }
  return "?";
}

TEST(UcxWaitPacer, Table) {
  const Case cases[] = {
      {"a reply while polling: a hit",
       50,
       {{true, 0, Next::kPoll}, {false, 5, Next::kPoll}, {false, 20, Next::kYieldAndPoll}},
       true,
       false},
      {"past the window it sleeps, and after a real sleep it polls no more: a miss",
       50,
       {{true, 0, Next::kPoll},
        {false, 60, Next::kSleep, true, 2},
        {false, 61, Next::kSleep, true, 4},
        {true, 5000, Next::kSleep, true, 2}},
       true,
       true},
      {"a sleep that returned at once neither ends polling nor counts as a miss",
       50,
       {{true, 0, Next::kPoll},
        {false, 60, Next::kSleep, false, 1},
        {true, 100, Next::kPoll},
        {false, 140, Next::kYieldAndPoll}},
       true,
       false},
      {"returned at once, then nothing moved: it tries to sleep again, still 1 ms",
       50,
       {{true, 0, Next::kPoll},
        {false, 60, Next::kSleep, false, 1},
        {false, 61, Next::kSleep, false, 1},
        {false, 62, Next::kSleep, true, 2},
        {true, 100, Next::kSleep, true, 2}},
       true,
       true},
      {"without spin it sleeps at the first clock read and reports nothing",
       0,
       {{true, 0, Next::kSleep, false, 1}, {false, 1, Next::kSleep, true, 2}},
       false,
       true},
      {"sleeps double to 50 ms while nothing moves, and start again at 1 ms",
       0,
       {{true, 0, Next::kSleep, true, 2},
        {false, 1, Next::kSleep, true, 4},
        {false, 2, Next::kSleep, true, 8},
        {false, 3, Next::kSleep, true, 16},
        {false, 4, Next::kSleep, true, 32},
        {false, 5, Next::kSleep, true, 50},
        {false, 6, Next::kSleep, true, 50},
        {true, 7, Next::kSleep, true, 2}},
       false,
       true},
  };
  const auto t0 = Clock::now();
  for (const Case& c : cases) {
    WaitPacer pacer{microseconds(c.spin_us)};
    bool first = true;
    for (size_t i = 0; i < c.ticks.size(); ++i) {
      const Tick& t = c.ticks[i];
      const std::string where = std::string(c.name) + ", tick " + std::to_string(i);
      if (t.moved && !first) pacer.Moved();
      first = false;
      // A new idle run reads the clock after kClockFreePolls idle calls, a continuing one after
      // 16 more.
      const uint64_t expect_calls = t.moved ? WaitPacer::kClockFreePolls : 16;
      uint64_t calls = 1;
      while (!pacer.ClockDue()) ++calls;
      EXPECT_EQ(calls, expect_calls) << where;
      const Next got = pacer.Decide(t0 + microseconds(t.at_us));
      EXPECT_STREQ(Name(got), Name(t.want)) << where;
      if (got == Next::kSleep) {
        pacer.Slept(t.waited);
        EXPECT_EQ(pacer.sleep_ms(), t.sleep_ms) << where;
      }
    }
    EXPECT_EQ(pacer.polled(), c.polled) << c.name;
    EXPECT_EQ(pacer.slept(), c.slept) << c.name;
  }
}

}  // namespace
}  // namespace cortado::dist::ucx
