// Checks on CUDA, cuDNN and cuBLAS calls: a failing call throws cortado::Error naming the call,
// the library's own name and words for the status, and where in Cortado it was made, e.g.
//   cudaMalloc(&ptr, bytes) failed: cudaErrorMemoryAllocation (out of memory) at
//   engine/cuda/cuda_runtime.cpp:41
// CORTADO_CUDA_LAUNCH() after a kernel launch reports a bad launch configuration at once (the
// kernel's own faults surface at the next synchronizing call, which names itself).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

namespace cortado::cuda {

[[noreturn]] void FailCuda(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void FailCudnn(cudnnStatus_t status, const char* call, const char* file, int line);
[[noreturn]] void FailCublas(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace cortado::cuda

#define CORTADO_CUDA_CHECK(call)                                             \
  do {                                                                       \
    const cudaError_t cortado_status_ = (call);                              \
    if (cortado_status_ != cudaSuccess)                                      \
      ::cortado::cuda::FailCuda(cortado_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define CORTADO_CUDA_LAUNCH() CORTADO_CUDA_CHECK(cudaGetLastError())

#define CORTADO_CUDNN_CHECK(call)                                             \
  do {                                                                        \
    const cudnnStatus_t cortado_status_ = (call);                             \
    if (cortado_status_ != CUDNN_STATUS_SUCCESS)                              \
      ::cortado::cuda::FailCudnn(cortado_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define CORTADO_CUBLAS_CHECK(call)                                             \
  do {                                                                         \
    const cublasStatus_t cortado_status_ = (call);                             \
    if (cortado_status_ != CUBLAS_STATUS_SUCCESS)                              \
      ::cortado::cuda::FailCublas(cortado_status_, #call, __FILE__, __LINE__); \
  } while (0)
