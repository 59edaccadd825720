// cuDNN and cuBLAS(Lt) loaded when a GPU is first used, not when the program starts: linked
// directly, their start-up (relocating some hundred MB of code, and their own allocations) cost
// every `cortado` process about 140 MB of resident memory, GPU or not. Cortado calls them
// through the pointers below, resolved by name from the sonames the toolkit installs
// (libcudnn.so.9, libcublasLt.so.13, libcublas.so.13). Each library that cannot be loaded is
// named in the error, with the loader's words.
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

namespace cortado::cuda {

struct CudaLibraries {
  cudnnStatus_t (*cudnnCreate)(cudnnHandle_t*);
  cudnnStatus_t (*cudnnSetStream)(cudnnHandle_t, cudaStream_t);
  const char* (*cudnnGetErrorString)(cudnnStatus_t);
  cublasStatus_t (*cublasLtCreate)(cublasLtHandle_t*);
  const char* (*cublasGetStatusName)(cublasStatus_t);
  const char* (*cublasGetStatusString)(cublasStatus_t);
};

// Loads the libraries on first call (thread-safe); throws naming what is missing.
const CudaLibraries& Libraries();

}  // namespace cortado::cuda
