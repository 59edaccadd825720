#include "engine/graph/math.h"

#include <cblas.h>

#include <algorithm>
#include <limits>

#ifdef CORTADO_HAVE_ONEDNN
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif

#include "engine/base/cpu_isa.h"
#include "engine/base/error.h"
#include "engine/base/thread_pool.h"

namespace cortado {
namespace {

// BLAS takes int sizes: a product whose sizes do not fit fails here instead of computing
// garbage from a truncated size.
int BlasInt(int64_t v, const char* what) {
  CORTADO_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "matrix product: ", what, " = ", v,
                " exceeds what BLAS takes (", std::numeric_limits<int>::max(), ")");
  return static_cast<int>(v);
}

}  // namespace

template <>
void GemmLd<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // Checked before either library sees them (oneDNN takes 64-bit sizes, its fallback does not).
  const int im = BlasInt(m, "m"), in = BlasInt(n, "n"), ik = BlasInt(k, "k");
  const int ilda = BlasInt(lda, "lda"), ildb = BlasInt(ldb, "ldb"), ildc = BlasInt(ldc, "ldc");
#ifdef CORTADO_HAVE_ONEDNN
  // oneDNN parallelizes with OpenMP; the engine already splits work across its own threads,
  // so every calling thread asks for one OpenMP thread (set once per thread).
  // The kernel-set cap (CORTADO_CPU_ISA) is applied before oneDNN's first product.
  static thread_local const bool single = (ApplyCpuIsaCap(), omp_set_num_threads(1), true);
  (void)single;
  dnnl_status_t status =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status == dnnl_success) return;
    // Fall through to OpenBLAS on the (unexpected) failure of oneDNN.
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, im, in,
              ik, alpha, a, ilda, b, ildb, beta, c, ildc);
}

template <>
void GemmLd<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                    const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                    double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const int im = BlasInt(m, "m"), in = BlasInt(n, "n"), ik = BlasInt(k, "k");
  const int ilda = BlasInt(lda, "lda"), ildb = BlasInt(ldb, "ldb"), ildc = BlasInt(ldc, "ldc");
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, im, in,
              ik, alpha, a, ilda, b, ildb, beta, c, ildc);
}

template <typename T>
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, const T* b,
          T beta, T* c) {
  GemmLd<T>(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

void SplitGemm(int64_t m, int64_t n, int64_t k,
               const std::function<void(int64_t, int64_t, int64_t, int64_t)>& part) {
  const int threads = NumThreads();
  // Each task needs enough work to amortize the hand-off (~64K multiply-adds).
  if (threads == 1 || m * n * k < 65536) return part(0, m, 0, n);
  if (m >= n || m >= 4 * threads) {
    ParallelFor(m, 4, [&](int64_t r0, int64_t r1) { part(r0, r1, 0, n); });
  } else {
    ParallelFor(n, 16, [&](int64_t c0, int64_t c1) { part(0, m, c0, c1); });
  }
}

template <typename T>
void ParallelGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                  const T* b, T beta, T* c) {
  const int64_t lda = ta ? m : k;
  const int64_t ldb = tb ? k : n;
  SplitGemm(m, n, k, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const T* a_rows = ta ? a + r0 : a + r0 * lda;
    const T* b_cols = tb ? b + c0 * ldb : b + c0;
    GemmLd<T>(ta, tb, r1 - r0, c1 - c0, k, alpha, a_rows, lda, b_cols, ldb, beta, c + r0 * n + c0,
              n);
  });
}

template <typename T>
void Axpy(int64_t n, T alpha, const T* x, T* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template void Gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, const float*,
                          float, float*);
template void Gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                           const double*, double, double*);
template void ParallelGemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                  const float*, float, float*);
template void ParallelGemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                   const double*, double, double*);
template void Axpy<float>(int64_t, float, const float*, float*);
template void Axpy<double>(int64_t, double, const double*, double*);

}  // namespace cortado
