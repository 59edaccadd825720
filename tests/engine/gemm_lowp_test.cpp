// The 16-bit products of mixed precision against an f64 reference of the same (16-bit) values,
// on both paths: oneDNN's native bf16 kernels (where the CPU has AVX512_BF16) and the widened
// f32 fallback every other CPU runs. Products of 16-bit values are exact in f32, so the only
// error is the f32 accumulation's: a few units of 2^-24 times the sum of |terms|.
#include "engine/graph/gemm_lowp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/base/error.h"
#include "engine/base/random.h"
#include "engine/base/thread_pool.h"

namespace cortado {
namespace {

template <typename S>
S From(float v) {
  if constexpr (std::is_same_v<S, BFloat16>) {
    return FloatToBFloat16(v);
  } else {
    return FloatToHalf(v);
  }
}
template <typename S>
double To(S v) {
  if constexpr (std::is_same_v<S, BFloat16>) {
    return BFloat16ToFloat(v);
  } else {
    return HalfToFloat(v);
  }
}

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  int64_t pad;  // extra elements per row of every operand (leading dimension > width)
  float beta;
};

// Restores the detected path when a test changes it.
class PathGuard {
 public:
  PathGuard() : saved_(BF16GemmPath()) {}
  ~PathGuard() { SetBF16GemmPath(saved_); }

 private:
  LowpGemmPath saved_;
};

template <typename S>
void ExpectMatchesReference(const Case& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "ta " << c.ta << " tb " << c.tb << " " << c.m << "x" << c.n
                                    << "x" << c.k << " pad " << c.pad << " beta " << c.beta
                                    << " path " << LowpGemmPathName(BF16GemmPath()));
  Rng rng(seed);
  const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
  std::vector<S> a(a_rows * lda), b(b_rows * ldb);
  for (S& v : a) v = From<S>(static_cast<float>(rng.Uniform(-2, 2)));
  for (S& v : b) v = From<S>(static_cast<float>(rng.Uniform(-2, 2)));
  std::vector<float> out(c.m * ldc);
  for (float& v : out) v = static_cast<float>(rng.Uniform(-1, 1));
  const std::vector<float> before = out;
  GemmLdLowp<S>(c.ta, c.tb, c.m, c.n, c.k, a.data(), lda, b.data(), ldb, c.beta, out.data(), ldc);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t l = 0; l < c.k; ++l) {
        const double x = To(c.ta ? a[l * lda + i] : a[i * lda + l]);
        const double y = To(c.tb ? b[j * ldb + l] : b[l * ldb + j]);
        sum += x * y;
        magnitude += std::abs(x * y);
      }
      const double prior = before[i * ldc + j];
      const double want = sum + c.beta * prior;
      const double tol = 8 * 0x1p-24 * (magnitude + std::abs(c.beta * prior) + 1e-30);
      ASSERT_NEAR(out[i * ldc + j], want, tol) << "at (" << i << ", " << j << ")";
    }
    // The padding between rows of C is not touched.
    for (int64_t j = c.n; j < ldc; ++j) ASSERT_EQ(out[i * ldc + j], before[i * ldc + j]);
  }
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {false, false, 7, 9, 13, 0, 0.0f},    {false, true, 16, 33, 64, 0, 1.0f},
      {true, false, 24, 5, 40, 3, 0.5f},    {true, true, 3, 17, 129, 2, 0.0f},
      {false, false, 64, 49, 576, 0, 0.0f}, {false, false, 1, 1, 1, 0, 1.0f},
      {false, true, 5, 6, 0, 1, 0.5f},  // empty reduction: C = beta * C
  };
  return cases;
}

TEST(LowpGemm, BF16OnTheWidenedPath) {
  PathGuard guard;
  SetBF16GemmPath(LowpGemmPath::kWidened);
  uint64_t seed = 1;
  for (const Case& c : Cases()) ExpectMatchesReference<BFloat16>(c, seed++);
}

TEST(LowpGemm, BF16OnTheNativePath) {
  if (!NativeBF16GemmAvailable()) {
    GTEST_SKIP() << "this CPU (or build) has no AVX512_BF16 oneDNN kernels; the widened path "
                    "is tested above";
  }
  PathGuard guard;
  SetBF16GemmPath(LowpGemmPath::kNative);
  uint64_t seed = 1;
  for (const Case& c : Cases()) ExpectMatchesReference<BFloat16>(c, seed++);
  // A second call of each shape reuses the cached primitive and must give the same answer.
  seed = 1;
  for (const Case& c : Cases()) ExpectMatchesReference<BFloat16>(c, seed++);
}

TEST(LowpGemm, F16) {
  uint64_t seed = 11;
  for (const Case& c : Cases()) ExpectMatchesReference<Half>(c, seed++);
}

TEST(LowpGemm, ParallelSplitsEqualOneCall) {
  // The pool splits rows or columns; every element is still one thread's full dot product
  // (oneDNN may block the reduction differently for a narrower part, so to f32 rounding).
  Rng rng(5);
  for (auto [m, n] : {std::pair<int64_t, int64_t>{96, 40}, {8, 300}}) {
    const int64_t k = 70;
    std::vector<BFloat16> a(m * k), b(k * n);
    for (auto& v : a) v = FloatToBFloat16(static_cast<float>(rng.Uniform(-1, 1)));
    for (auto& v : b) v = FloatToBFloat16(static_cast<float>(rng.Uniform(-1, 1)));
    std::vector<float> one(m * n, 0.0f), many(m * n, 0.0f);
    GemmLdLowp<BFloat16>(false, false, m, n, k, a.data(), k, b.data(), n, 0.0f, one.data(), n);
    SetNumThreads(2);
    ParallelGemmLowp<BFloat16>(false, false, m, n, k, a.data(), b.data(), 0.0f, many.data());
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_NEAR(one[i], many[i], 1e-5f * (1 + std::abs(one[i]))) << m << "x" << n << " at " << i;
    }
  }
}

// Two threads multiplying at once, call after call, give what each gives alone. (oneDNN's
// convolutions did not, with the library's scratchpad, in Debian's build: engine/graph/
// conv_onednn.cpp gives them one per thread. The matmuls here, which also use a scratchpad to
// pack their operands, are held to the same.)
TEST(LowpGemm, NativeProductsOnTwoThreadsAtOnceRepeat) {
  if (!NativeBF16GemmAvailable()) GTEST_SKIP() << "no native bf16 products on this CPU or build";
  PathGuard guard;
  SetBF16GemmPath(LowpGemmPath::kNative);
  const int saved = NumThreads();
  SetNumThreads(2);
  Rng rng(9);
  // Large enough that the kernels pack their operands (a scratchpad of 130-260 KB).
  const int64_t m = 64, n = 784, k = 576;
  std::vector<BFloat16> a(2 * m * k), b(2 * k * n);
  for (auto& v : a) v = FloatToBFloat16(static_cast<float>(rng.Uniform(-1, 1)));
  for (auto& v : b) v = FloatToBFloat16(static_cast<float>(rng.Uniform(-1, 1)));
  std::vector<float> alone(2 * m * n);
  for (int t = 0; t < 2; ++t) {
    GemmLdLowp<BFloat16>(false, false, m, n, k, a.data() + t * m * k, k, b.data() + t * k * n, n,
                         0.0f, alone.data() + t * m * n, n);
  }
  int differ = 0;
  for (int rep = 0; rep < 100; ++rep) {
    std::vector<float> both(2 * m * n);
    ParallelTasks(2, [&](int t) {
      GemmLdLowp<BFloat16>(false, false, m, n, k, a.data() + t * m * k, k, b.data() + t * k * n, n,
                           0.0f, both.data() + t * m * n, n);
    });
    differ += both != alone;
  }
  EXPECT_EQ(differ, 0);
  SetNumThreads(saved);
}

TEST(LowpGemm, NativeIsRefusedWhereUnavailable) {
  if (NativeBF16GemmAvailable()) GTEST_SKIP() << "this CPU has native bf16 products";
  EXPECT_THROW(SetBF16GemmPath(LowpGemmPath::kNative), Error);
}

}  // namespace
}  // namespace cortado
