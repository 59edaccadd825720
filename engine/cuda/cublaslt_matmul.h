// Matrix products on a GPU through cuBLASLt, in the row-major terms of the layers:
//   C (m x n) = op(A) (m x k) op(B) (k x n)         op: the matrix or its transpose
// with A and B in `dtype` (f32, f16 or bf16), C in `out_dtype` (f32, or the 16-bit dtype of the
// inputs), products accumulated in f32 (TF32 tensor cores for f32 only where allowed), and an
// optional epilogue fused into the same kernel:
//   kBias          C += bias (n), each row alike; bias in C's dtype (cuBLASLt's rule)
//   kBiasGradient  also writes bias_grad (m): bias_grad[i] = sum over k of op(A)[i, k], in C's
//                  dtype; for A^T B products only (the weight gradient's shape)
// The inner product layer's three products (x: N x K_in, W: K_out x K_in, row-major):
//   forward       y (N x K_out)     = x W^T + b     m=N,     n=K_out, k=K_in,  transpose_b, kBias
//   weight grad   dW (K_out x K_in) = dy^T x        m=K_out, n=K_in,  k=N,     transpose_a,
//                 with kBiasGradient: db = the column sums of dy, in the same pass
//   input grad    dx (N x K_in)     = dy W          m=N,     n=K_in,  k=K_out
// With 16-bit activations, dW and db come out in f32 (out_dtype f32), as the CPU keeps them.
//
// cuBLASLt is column-major. A row-major C is its column-major C^T, so what runs is
//   C^T (n x m) = op(B)^T op(A)^T
// with B in cuBLASLt's A place and A in its B place (LtOperandsOf: a pure function, tested on the
// host against a column-major reference). Descriptors and layouts need no GPU; cuBLASLt's handle
// and its heuristics do, so the algorithm is chosen per case on the GPU, once, and cached with the
// descriptors (MatmulPlanCache).
//
// Threads: a cache is thread-safe; RunMatmul queues on the GPU's compute stream, which the engine
// drives from one thread (it sets the bias pointers on the cached descriptor).
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/tensor/dtype.h"

namespace cortado::cuda {

enum class MatmulEpilogue : uint8_t { kNone, kBias, kBiasGradient };

struct MatmulCase {
  int64_t m = 1, n = 1, k = 1;
  bool transpose_a = false, transpose_b = false;
  DType dtype = DType::kF32;      // A and B
  DType out_dtype = DType::kF32;  // C (and the bias, or the bias gradient)
  bool allow_tf32 = false;        // f32 only
  MatmulEpilogue epilogue = MatmulEpilogue::kNone;
};

// The case's identity in the cache and in messages, e.g.
//   "C (256 x 1000) = A (256 x 2048) B^T (2048 x 1000), f16 -> f16, bias"
// (A^T / B^T where transposed; "f32 (TF32 allowed)" for f32 with TF32).
std::string MatmulKey(const MatmulCase& c);
// Throws naming the case when a size is not positive, the dtypes are not a supported pair or the
// bias gradient is asked of a product that is not A^T B.
void CheckMatmulCase(const MatmulCase& c);

// One matrix as cuBLASLt is told it: the stored matrix seen column-major (rows, cols, leading
// dimension) and whether the product uses its transpose.
struct LtMatrix {
  int64_t rows = 0, cols = 0, ld = 0;
  bool transposed = false;
  bool operator==(const LtMatrix&) const = default;
};
struct LtOperands {
  LtMatrix a;  // our B
  LtMatrix b;  // our A
  LtMatrix d;  // our C, as C^T (n x m)
};
LtOperands LtOperandsOf(const MatmulCase& c);

// The matmul descriptor and the A, B and D layouts of a case (C = D: beta is 0, the output is
// overwritten). Made without a GPU; throws naming the call and cuBLASLt's status.
class MatmulDescriptors {
 public:
  explicit MatmulDescriptors(const MatmulCase& c);
  ~MatmulDescriptors();
  MatmulDescriptors(const MatmulDescriptors&) = delete;
  MatmulDescriptors& operator=(const MatmulDescriptors&) = delete;

  cublasLtMatmulDesc_t op() const { return op_; }
  cublasLtMatrixLayout_t a() const { return a_; }
  cublasLtMatrixLayout_t b() const { return b_; }
  cublasLtMatrixLayout_t d() const { return d_; }

 private:
  void Make(const MatmulCase& c);
  void Release();
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
};

// Pointers of every matrix are promised to cuBLASLt's heuristics aligned this far (the caching
// allocator's blocks and the memory plan's offsets are); RunMatmul checks it.
inline constexpr int kMatmulAlignment = 16;
// Workspace offered to cuBLASLt's algorithms (what it recommends for Hopper).
inline constexpr size_t kMatmulWorkspaceLimit = size_t{32} << 20;

struct MatmulPlan {
  std::string key;
  std::unique_ptr<MatmulDescriptors> descriptors;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
};

// Plans by case for one GPU (its cuBLASLt handle): descriptors and the algorithm cuBLASLt's
// heuristics rank first, made on the first call with a case.
class MatmulPlanCache {
 public:
  explicit MatmulPlanCache(cublasLtHandle_t handle, size_t workspace_limit = kMatmulWorkspaceLimit);
  // Throws "cuBLASLt has no algorithm for <key>: ..." when the heuristics offer none.
  const MatmulPlan& Get(const MatmulCase& c);
  size_t size() const;

 private:
  cublasLtHandle_t handle_;
  size_t workspace_limit_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<MatmulPlan>> plans_;
};

// Device pointers of one product; bias for kBias, bias_grad for kBiasGradient, else null.
struct MatmulTensors {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;
  void* bias_grad = nullptr;
};

// Runs `c` on GPU `device` (its compute stream and workspace; the plan from that GPU's cache).
// Throws naming the case when a pointer the case needs is null or not aligned.
void RunMatmul(int device, const MatmulCase& c, const MatmulTensors& tensors);

}  // namespace cortado::cuda
