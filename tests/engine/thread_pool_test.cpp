#include "engine/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <vector>

#include "engine/error.h"
#include "engine/math.h"

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
    if (r % 5000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let workers sleep
  }
  EXPECT_EQ(total, 20000 * 64);
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
