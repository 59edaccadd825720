// One GPU's long-lived state: its compute stream (every kernel, cuDNN and cuBLAS call of the
// engine is queued there, in order), a copy stream for the loader's host-to-device transfers, the
// cuDNN and cuBLASLt handles bound to the compute stream, and a workspace that grows to the
// largest size a call has asked for. Created on first use of the device and kept for the
// process's life: destroying CUDA state from a static destructor races the driver's own
// teardown, so these are deliberately never freed.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>

namespace cortado::cuda {

class CudaContext {
 public:
  // The context of GPU `index`, created (and the device made current) on first call.
  static CudaContext& Get(int index);

  int index() const { return index_; }
  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t copy_stream() const { return copy_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasLtHandle_t cublas_lt() const { return cublas_lt_; }
  // Makes this GPU the calling thread's current device.
  void MakeCurrent() const;
  // At least `bytes` of device scratch, valid until the next call (stream-ordered: only work on
  // the compute stream may use it).
  void* Workspace(size_t bytes);

 private:
  explicit CudaContext(int index);
  int index_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasLtHandle_t cublas_lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace cortado::cuda
