#include "engine/cuda/cublaslt_matmul.h"

#include <cstdint>
#include <utility>

#include "engine/base/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/cuda_libraries.h"

namespace cortado::cuda {
namespace {

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      Fail("cuBLASLt products take f32, f16 or bf16 matrices, not ", DTypeName(dtype));
  }
}

std::string Dims(int64_t rows, int64_t cols) { return StrCat("(", rows, " x ", cols, ")"); }

cublasLtMatrixLayout_t MakeLayout(DType dtype, const LtMatrix& m) {
  cublasLtMatrixLayout_t layout = nullptr;
  CORTADO_CUBLAS_CHECK(Libraries().cublasLtMatrixLayoutCreate(&layout, CudaType(dtype),
                                                              static_cast<uint64_t>(m.rows),
                                                              static_cast<uint64_t>(m.cols), m.ld));
  return layout;
}

}  // namespace

std::string MatmulKey(const MatmulCase& c) {
  const std::string in =
      c.dtype == DType::kF32 && c.allow_tf32 ? "f32 (TF32 allowed)" : DTypeName(c.dtype);
  const char* epilogue = c.epilogue == MatmulEpilogue::kBias           ? ", bias"
                         : c.epilogue == MatmulEpilogue::kBiasGradient ? ", bias gradient"
                                                                       : "";
  return StrCat("C ", Dims(c.m, c.n), " = A", c.transpose_a ? "^T " : " ", Dims(c.m, c.k), " B",
                c.transpose_b ? "^T " : " ", Dims(c.k, c.n), ", ", in, " -> ",
                DTypeName(c.out_dtype), epilogue);
}

void CheckMatmulCase(const MatmulCase& c) {
  if (c.m <= 0 || c.n <= 0 || c.k <= 0) Fail("matmul ", MatmulKey(c), ": sizes must be positive");
  CudaType(c.dtype);
  CudaType(c.out_dtype);
  // cuBLASLt's f32-accumulating pairs: f32 -> f32, and 16-bit -> the same 16-bit type or f32.
  if (c.out_dtype != c.dtype && c.out_dtype != DType::kF32) {
    Fail("matmul ", MatmulKey(c), ": the output is f32 or the inputs' dtype");
  }
  // BGRADB as fused dense layers use it (cuBLASLt's B, our A, transposed): other shapes are not
  // documented to have kernels.
  if (c.epilogue == MatmulEpilogue::kBiasGradient && (!c.transpose_a || c.transpose_b)) {
    Fail("matmul ", MatmulKey(c),
         ": the bias gradient is fused into A^T B products only (the "
         "weight gradient dy^T x)");
  }
}

LtOperands LtOperandsOf(const MatmulCase& c) {
  LtOperands ops;
  // Our B stored row-major, seen column-major: (n x k) leading n when not transposed, which is
  // op(B)^T as it stands; (k x n) leading k when transposed, whose transpose is op(B)^T.
  ops.a = c.transpose_b ? LtMatrix{c.k, c.n, c.k, true} : LtMatrix{c.n, c.k, c.n, false};
  // Our A alike: op(A)^T is (k x m).
  ops.b = c.transpose_a ? LtMatrix{c.m, c.k, c.m, true} : LtMatrix{c.k, c.m, c.k, false};
  ops.d = LtMatrix{c.n, c.m, c.n, false};
  return ops;
}

MatmulDescriptors::MatmulDescriptors(const MatmulCase& c) {
  CheckMatmulCase(c);
  try {
    Make(c);
  } catch (...) {
    Release();  // what was made before the failing call
    throw;
  }
}

void MatmulDescriptors::Make(const MatmulCase& c) {
  const CudaLibraries& l = Libraries();
  const cublasComputeType_t compute =
      c.dtype == DType::kF32 && c.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  CORTADO_CUBLAS_CHECK(l.cublasLtMatmulDescCreate(&op_, compute, CUDA_R_32F));
  const LtOperands ops = LtOperandsOf(c);
  const cublasOperation_t trans_a = ops.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = ops.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  CORTADO_CUBLAS_CHECK(l.cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                        sizeof(trans_a)));
  CORTADO_CUBLAS_CHECK(l.cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                        sizeof(trans_b)));
  // BIAS adds a vector along D's rows (our C's columns); BGRADB sums cuBLASLt's B (our A) over k.
  const cublasLtEpilogue_t epilogue = c.epilogue == MatmulEpilogue::kBias ? CUBLASLT_EPILOGUE_BIAS
                                      : c.epilogue == MatmulEpilogue::kBiasGradient
                                          ? CUBLASLT_EPILOGUE_BGRADB
                                          : CUBLASLT_EPILOGUE_DEFAULT;
  CORTADO_CUBLAS_CHECK(l.cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &epilogue, sizeof(epilogue)));
  a_ = MakeLayout(c.dtype, ops.a);
  b_ = MakeLayout(c.dtype, ops.b);
  d_ = MakeLayout(c.out_dtype, ops.d);
}

MatmulDescriptors::~MatmulDescriptors() { Release(); }

void MatmulDescriptors::Release() {
  const CudaLibraries& l = Libraries();
  if (d_ != nullptr) l.cublasLtMatrixLayoutDestroy(d_);
  if (b_ != nullptr) l.cublasLtMatrixLayoutDestroy(b_);
  if (a_ != nullptr) l.cublasLtMatrixLayoutDestroy(a_);
  if (op_ != nullptr) l.cublasLtMatmulDescDestroy(op_);
  op_ = nullptr, a_ = b_ = d_ = nullptr;
}

MatmulPlanCache::MatmulPlanCache(cublasLtHandle_t handle, size_t workspace_limit)
    : handle_(handle), workspace_limit_(workspace_limit) {}

const MatmulPlan& MatmulPlanCache::Get(const MatmulCase& c) {
  std::string key = MatmulKey(c);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<MatmulPlan>();
  plan->descriptors = std::make_unique<MatmulDescriptors>(c);
  const CudaLibraries& l = Libraries();
  cublasLtMatmulPreference_t preference = nullptr;
  CORTADO_CUBLAS_CHECK(l.cublasLtMatmulPreferenceCreate(&preference));
  const uint32_t alignment = kMatmulAlignment;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  for (cublasLtMatmulPreferenceAttributes_t attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = l.cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment,
                                                      sizeof(alignment));
    }
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status =
        l.cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &workspace_limit_, sizeof(workspace_limit_));
  }
  const MatmulDescriptors& d = *plan->descriptors;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = l.cublasLtMatmulAlgoGetHeuristic(handle_, d.op(), d.a(), d.b(), d.d(), d.d(),
                                              preference, 1, &result, &found);
  }
  l.cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    Fail("cuBLASLt has no algorithm for ", key, ": ",
         status != CUBLAS_STATUS_SUCCESS ? l.cublasGetStatusString(status)
                                         : "its heuristics offered none");
  }
  plan->algo = result.algo;
  plan->workspace_bytes = result.workspaceSize;
  plan->key = std::move(key);
  const MatmulPlan& stored = *plan;
  plans_.emplace(stored.key, std::move(plan));
  return stored;
}

size_t MatmulPlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

void RunMatmul(int device, const MatmulCase& c, const MatmulTensors& t) {
  const bool bias = c.epilogue == MatmulEpilogue::kBias;
  const bool bias_grad = c.epilogue == MatmulEpilogue::kBiasGradient;
  const struct {
    const void* pointer;
    bool needed;
    const char* name;
  } pointers[] = {{t.a, true, "A"},
                  {t.b, true, "B"},
                  {t.c, true, "C"},
                  {t.bias, bias, "bias"},
                  {t.bias_grad, bias_grad, "bias gradient"}};
  for (const auto& p : pointers) {
    if (p.needed &&
        (p.pointer == nullptr || reinterpret_cast<uintptr_t>(p.pointer) % kMatmulAlignment != 0)) {
      Fail("matmul ", MatmulKey(c), ": ", p.name, " at ", p.pointer,
           " is not a device pointer aligned to ", kMatmulAlignment, " bytes");
    }
  }
  // One cache per GPU, never freed (as the contexts: cuda_context.h).
  static std::mutex mu;
  static std::map<int, MatmulPlanCache*> caches;
  CudaContext& context = CudaContext::Get(device);
  MatmulPlanCache* cache = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    MatmulPlanCache*& slot = caches[device];
    if (slot == nullptr) slot = new MatmulPlanCache(context.cublas_lt());
    cache = slot;
  }
  const MatmulPlan& plan = cache->Get(c);
  const CudaLibraries& l = Libraries();
  const MatmulDescriptors& d = *plan.descriptors;
  if (bias || bias_grad) {
    const void* vector = bias ? t.bias : t.bias_grad;
    CORTADO_CUBLAS_CHECK(l.cublasLtMatmulDescSetAttribute(d.op(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                          &vector, sizeof(vector)));
  }
  context.MakeCurrent();
  void* workspace = plan.workspace_bytes > 0 ? context.Workspace(plan.workspace_bytes) : nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  // cuBLASLt's A is our B and its B our A (LtOperandsOf).
  CORTADO_CUBLAS_CHECK(l.cublasLtMatmul(context.cublas_lt(), d.op(), &alpha, t.b, d.a(), t.a, d.b(),
                                        &beta, t.c, d.d(), t.c, d.d(), &plan.algo, workspace,
                                        plan.workspace_bytes, context.compute_stream()));
}

}  // namespace cortado::cuda
