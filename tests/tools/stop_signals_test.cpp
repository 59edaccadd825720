// StopSignals: SIGINT and SIGTERM become a flag, and never interrupt a thread started after
// it. The storm test is the defect this fixes: with only a handler installed, signals landing
// in oneDNN's JIT GEMM kernels corrupted the heap (a loop like this one aborted with
// "corrupted size vs. prev_size" within seconds; one Ctrl-C in about 20 crashed a training).
#include "tools/stop_signals.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "engine/graph/math.h"

namespace cortado::tools {
namespace {

bool Blocked(int sig) {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, sig) == 1;
}

bool WaitForFlag(const std::atomic<bool>* flag) {
  for (int i = 0; i < 200 && !flag->load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return flag->load();
}

TEST(StopSignals, SignalsSetTheFlagAndNeverReachThreadsStartedAfter) {
  StopSignals stop;
  EXPECT_FALSE(stop.flag()->load());
  EXPECT_TRUE(Blocked(SIGINT));
  EXPECT_TRUE(Blocked(SIGTERM));
  bool inherited = false;
  std::thread([&] { inherited = Blocked(SIGINT) && Blocked(SIGTERM); }).join();
  EXPECT_TRUE(inherited);
  kill(getpid(), SIGTERM);
  EXPECT_TRUE(WaitForFlag(stop.flag()));
}

TEST(StopSignals, AStormOfSignalsDuringGemmLeavesTheHeapIntact) {
  StopSignals stop;
  ASSERT_FALSE(stop.flag()->load());
  std::atomic<bool> done{false};
  // Process-directed, as Ctrl-C and `kill` are: the kernel picks any thread that takes them.
  std::thread storm([&] {
    while (!done) {
      kill(getpid(), SIGINT);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  // LeNet-like shapes (fc1 and conv2 of batch 8), with heap traffic in between.
  const int64_t shapes[][3] = {{512, 3136, 8}, {8, 3136, 512}, {64, 784, 800}, {800, 784, 64}};
  std::vector<float> a(4 << 20, 0.5f), b(4 << 20, 0.25f), c(4 << 20);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int64_t calls = 0;
  while (std::chrono::steady_clock::now() < until) {
    for (const auto& s : shapes) {
      GemmLd<float>(false, true, s[0], s[1], s[2], 1.0f, a.data(), s[2], b.data(), s[2], 0.0f,
                    c.data(), s[1]);
      std::vector<float> junk(1000 + static_cast<size_t>(calls % 97));
      ++calls;
    }
  }
  done = true;
  storm.join();
  EXPECT_FLOAT_EQ(c[0], 0.5f * 0.25f * 64);  // the last shape's k
  EXPECT_TRUE(stop.flag()->load());
  EXPECT_GT(calls, 100);
}

}  // namespace
}  // namespace cortado::tools
