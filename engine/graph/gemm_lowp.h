// Matrix products of 16-bit operands, the GEMMs of mixed precision:
//   C[M,N] (f32) = op(A) * op(B) + beta * C, with A and B stored as bf16 or f16
// and every product and sum in f32 (a bf16 or f16 value times another is exact in f32, so
// the only rounding is the f32 accumulation's, as in the f32 GEMM of the widened operands).
//
// bf16 runs oneDNN's native kernels (vdpbf16ps) where the CPU has AVX512_BF16; everywhere
// else, and for f16 always (oneDNN 2.6 has no f16 CPU GEMM), the operands are widened to f32
// with the codec's vector kernels (F16C for f16) into a per-thread buffer and multiplied with
// the f32 GEMM. Both paths take the same arguments and agree to f32 rounding.
#pragma once

#include <cstdint>

#include "engine/tensor/dtype.h"

namespace cortado {

enum class LowpGemmPath {
  kNative,   // oneDNN bf16 matmul (AVX512_BF16 or AMX)
  kWidened,  // widen to f32, then the f32 GEMM
};

// The path bf16 products take: kNative where the CPU and the build allow it, unless the
// environment says CORTADO_GEMM_BF16=widened. f16 products always take kWidened.
LowpGemmPath BF16GemmPath();
const char* LowpGemmPathName(LowpGemmPath path);
// Overrides the detected path (tests compare the two). kNative where it is not available
// throws.
void SetBF16GemmPath(LowpGemmPath path);
// Whether this CPU and build can run native bf16 products at all.
bool NativeBF16GemmAvailable();

// Row-major, explicit leading dimensions as GemmLd; S is BFloat16 or Half. Single-threaded:
// callers split the work (as with GemmLd).
template <typename S>
void GemmLdLowp(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const S* a,
                int64_t lda, const S* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Multithreaded, dense leading dimensions (as ParallelGemm).
template <typename S>
void ParallelGemmLowp(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const S* a,
                      const S* b, float beta, float* c);

}  // namespace cortado
