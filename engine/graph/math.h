// CPU math used by the layers: GEMM through OpenBLAS (single-threaded per call; the caller
// parallelizes), and a few vector helpers. Row-major throughout.
#pragma once

#include <cstdint>
#include <functional>

namespace cortado {

// C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; row-major, leading dimensions
// implied by the shapes (A: M x K or K x M when trans_a, B: K x N or N x K when trans_b).
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          const T* b, T beta, T* c);

// Same with explicit leading dimensions, for operating on sub-matrices.
template <typename T>
void GemmLd(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
            int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// Multithreaded GEMM: splits the rows of C (or, when M is small, the columns) across the pool.
template <typename T>
void ParallelGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                  const T* b, T beta, T* c);

// How ParallelGemm splits C[M,N] across the pool: part(r0, r1, c0, c1) computes rows [r0, r1)
// and columns [c0, c1), the rows when M is large, else the columns; inline when the product is
// too small to share. Shared with the 16-bit products (engine/graph/gemm_lowp.h).
void SplitGemm(int64_t m, int64_t n, int64_t k,
               const std::function<void(int64_t, int64_t, int64_t, int64_t)>& part);

// y = alpha * x + y
template <typename T>
void Axpy(int64_t n, T alpha, const T* x, T* y);

}  // namespace cortado
