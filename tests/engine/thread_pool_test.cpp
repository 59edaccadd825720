#include "engine/base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/base/error.h"
#include "engine/graph/math.h"

namespace cortado {
namespace {

TEST(ThreadPool, ParallelForCoversRangeOnce) {
  SetNumThreads(3);
  std::vector<std::atomic<int>> hits(1001);
  ParallelFor(1001, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  SetNumThreads(2);
}

// Many short regions back to back: the hand-off between spinning and sleeping must never
// lose a wake-up (a lost one hangs here).
TEST(ThreadPool, ManyShortRegionsComplete) {
  SetNumThreads(2);
  int64_t total = 0;
  for (int r = 0; r < 20000; ++r) {
    std::atomic<int64_t> sum{0};
    ParallelFor(64, 1, [&](int64_t b, int64_t e) { sum += e - b; });
    total += sum.load();
    if (r % 5000 == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let workers sleep
  }
  EXPECT_EQ(total, 20000 * 64);
}

// Runs body on a thread of its own and ends the test binary if it has not finished after
// `seconds`: a pool that loses count of a job hangs, and a hang must fail the test, not stall it.
void WithDeadline(double seconds, const std::function<void()>& body) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread runner([&] {
    body();
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; })) {
    std::fprintf(stderr, "thread_pool_test: still running after %.0f s: the pool hangs\n", seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }
  lock.unlock();
  runner.join();
}

// Back-to-back ParallelFor jobs whose task counts alternate between small and large (for 8
// threads: 1, 7, 2, 8, 3, 8, 5, 2 tasks), so that a worker left behind by one job meets a next
// job that includes it. Checks that every item of every job ran exactly once, and that
// ParallelFor never returned while one of its tasks was still running. Returns a description of
// the first fault, or "" when there was none.
std::string RunAlternatingJobs(int threads, int jobs) {
  static const int64_t kSizes[] = {1, 7, 2, 64, 3, 64, 5, 2};
  constexpr int64_t kMaxSize = 64;
  SetNumThreads(threads);
  // Outlives every job, so that a task that runs late writes here and is seen, not elsewhere.
  static std::vector<std::atomic<int>> hits(kMaxSize);
  static std::atomic<int> running{0};
  for (auto& h : hits) h = 0;
  running = 0;
  std::string fault;
  for (int j = 0; j < jobs && fault.empty(); ++j) {
    const int64_t n = kSizes[j % 8];
    ParallelFor(n, 1, [&](int64_t b, int64_t e) {
      running.fetch_add(1);
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      running.fetch_sub(1);
    });
    if (const int r = running.load(); r != 0) {
      fault = StrCat("job ", j, " (", n, " items, ", threads,
                     " threads): ParallelFor returned while ", r, " of its tasks still ran");
    }
    std::string counts;
    bool bad = false;
    for (int64_t i = 0; i < kMaxSize; ++i) {
      const int c = hits[i].exchange(0);
      if (i < n) counts += StrCat(c, i + 1 < n ? " " : "");
      if (c != (i < n ? 1 : 0)) bad = true;
    }
    if (bad && fault.empty()) {
      fault = StrCat("job ", j, " (", n, " items, ", threads, " threads): per-item run counts ",
                     counts, " (each should be 1)");
    }
  }
  return fault;
}

TEST(ThreadPool, AlternatingJobSizesRunEveryTaskExactlyOnce) {
  WithDeadline(120, [] {
    for (int threads : {4, 8}) {
      // 4000 jobs: about 2 s at 8 threads on 2 busy cores (spinning workers there take turns).
      const std::string fault = RunAlternatingJobs(threads, 4000);
      EXPECT_EQ(fault, "") << threads << " threads";
    }
  });
  SetNumThreads(2);
}

// The interleaving of issue 12, made to happen: workers stall for 200 us right after taking a
// job, before reading its task data. A worker that sat out a small job and stalls there meets
// the next, larger job; it must not run a task of that job with the small job's view of it
// (before the fix it ran one twice, per-item counts such as "1 0 2", then the pool hung).
std::atomic<int> g_hook_calls{0};
void StallSomeWorkers(int worker) {
  if ((g_hook_calls.fetch_add(1, std::memory_order_relaxed) + worker) % 3 == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

TEST(ThreadPool, WorkerStalledWhileTakingAJobRunsNoTaskTwice) {
  WithDeadline(120, [] {
    SetWorkerHookForTesting(StallSomeWorkers);
    for (int threads : {4, 8}) {
      const std::string fault = RunAlternatingJobs(threads, 2000);
      EXPECT_EQ(fault, "") << threads << " threads";
    }
    SetWorkerHookForTesting(nullptr);
  });
  SetNumThreads(2);
}

TEST(ThreadPool, NestedCallsRunInline) {
  SetNumThreads(2);
  std::atomic<int> total{0};
  ParallelFor(4, 1, [&](int64_t b, int64_t e) {
    ParallelFor(10, 1, [&](int64_t b2, int64_t e2) { total += static_cast<int>(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 20);
}

TEST(ThreadPool, ExceptionsReachTheCaller) {
  SetNumThreads(2);
  EXPECT_THROW(ParallelFor(100, 1,
                           [&](int64_t b, int64_t) {
                             if (b > 0) Fail("boom");
                           }),
               Error);
  // The pool still works afterwards.
  std::atomic<int> n{0};
  ParallelFor(100, 1, [&](int64_t b, int64_t e) { n += static_cast<int>(e - b); });
  EXPECT_EQ(n.load(), 100);
}

TEST(Math, ParallelGemmMatchesSerial) {
  SetNumThreads(2);
  const int64_t m = 37, n = 53, k = 41;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<double> a(m * k), b(k * n), c1(m * n, 1.0), c2(m * n, 1.0);
      for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(i * 0.37);
      for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(i * 0.11);
      Gemm<double>(ta, tb, m, n, k, 1.5, a.data(), b.data(), 0.5, c1.data());
      // Reference: the textbook triple loop.
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) {
            double av = ta ? a[p * m + i] : a[i * k + p];
            double bv = tb ? b[j * k + p] : b[p * n + j];
            s += av * bv;
          }
          c2[i * n + j] = 1.5 * s + 0.5;
        }
      }
      for (size_t i = 0; i < c1.size(); ++i) ASSERT_NEAR(c1[i], c2[i], 1e-10) << ta << tb << i;
      std::vector<double> c3(m * n, 1.0);
      ParallelGemm<double>(ta, tb, m, n, k, 1.5, a.data(), b.data(), 0.5, c3.data());
      for (size_t i = 0; i < c1.size(); ++i) ASSERT_NEAR(c3[i], c2[i], 1e-10);
    }
  }
}

// Sizes beyond BLAS's int are refused with the size named, before any memory is touched (a
// truncated size would silently compute part of the product).
TEST(Math, GemmSizesBeyondIntAreRefused) {
  const int64_t huge = int64_t{1} << 31;
  for (bool f32 : {true, false}) {
    try {
      if (f32) {
        GemmLd<float>(false, false, huge, 1, 1, 1.0f, nullptr, 1, nullptr, 1, 0.0f, nullptr, 1);
      } else {
        GemmLd<double>(false, false, 1, 1, huge, 1.0, nullptr, huge, nullptr, 1, 0.0, nullptr, 1);
      }
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(f32 ? "m = 2147483648" : "k = 2147483648"), std::string::npos) << m;
      EXPECT_NE(m.find("exceeds what BLAS takes"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace cortado

namespace cortado {
namespace {

// The f32 path (oneDNN where built with it, else OpenBLAS) against the f64 reference.
TEST(Math, FloatGemmMatchesDoubleReference) {
  SetNumThreads(2);
  const int64_t m = 33, n = 70, k = 29;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> a(m * k), b(k * n), c(m * n, 0.5f);
      std::vector<double> ad(m * k), bd(k * n), cd(m * n, 0.5);
      for (size_t i = 0; i < a.size(); ++i) ad[i] = a[i] = static_cast<float>(std::sin(i * 0.3));
      for (size_t i = 0; i < b.size(); ++i) bd[i] = b[i] = static_cast<float>(std::cos(i * 0.7));
      ParallelGemm<float>(ta, tb, m, n, k, 2.0f, a.data(), b.data(), -1.0f, c.data());
      Gemm<double>(ta, tb, m, n, k, 2.0, ad.data(), bd.data(), -1.0, cd.data());
      for (size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(c[i], cd[i], 1e-4) << ta << tb << i;
    }
  }
}

}  // namespace
}  // namespace cortado
