#include "engine/cuda/cuda_context.h"

#include <memory>
#include <mutex>
#include <vector>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_libraries.h"

namespace cortado::cuda {

CudaContext& CudaContext::Get(int index) {
  static std::mutex mu;
  static std::vector<CudaContext*> contexts;  // never freed: see the header
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<size_t>(index) >= contexts.size()) contexts.resize(index + 1, nullptr);
  if (contexts[index] == nullptr) contexts[index] = new CudaContext(index);
  return *contexts[index];
}

CudaContext::CudaContext(int index) : index_(index) {
  CORTADO_CUDA_CHECK(cudaSetDevice(index));
  // The copy stream must not wait behind the default stream's work.
  CORTADO_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  CORTADO_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  const CudaLibraries& libraries = Libraries();
  CORTADO_CUDNN_CHECK(libraries.cudnnCreate(&cudnn_));
  CORTADO_CUDNN_CHECK(libraries.cudnnSetStream(cudnn_, compute_));
  CORTADO_CUBLAS_CHECK(libraries.cublasLtCreate(&cublas_lt_));
}

void CudaContext::MakeCurrent() const { CORTADO_CUDA_CHECK(cudaSetDevice(index_)); }

void* CudaContext::Workspace(size_t bytes) {
  if (bytes > workspace_bytes_) {
    MakeCurrent();
    if (workspace_ != nullptr) CORTADO_CUDA_CHECK(cudaFreeAsync(workspace_, compute_));
    CORTADO_CUDA_CHECK(cudaMallocAsync(&workspace_, bytes, compute_));
    workspace_bytes_ = bytes;
  }
  return workspace_;
}

}  // namespace cortado::cuda
