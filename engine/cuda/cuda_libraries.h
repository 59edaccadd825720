// cuDNN and cuBLAS(Lt) loaded when a GPU is first used, not when the program starts: linked
// directly, their start-up (relocating some hundred MB of code, and their own allocations) cost
// every `cortado` process about 140 MB of resident memory, GPU or not. Cortado calls them
// through the pointers below, resolved by name from the sonames the toolkit installs
// (libcudnn.so.9, libcublasLt.so.13, libcublas.so.13). Each library that cannot be loaded is
// named in the error, with the loader's words.
//
// Loading needs no GPU: host tests build cuDNN's and cuBLASLt's descriptors through this table
// on machines without one (docs/CUDA.md lists which calls work there).
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

namespace cortado::cuda {

// Each member has the type of the library function of the same name.
#define CORTADO_LIBRARY_FN(name) decltype(&::name) name
struct CudaLibraries {
  // cuDNN: the handle, versions and errors.
  CORTADO_LIBRARY_FN(cudnnCreate);
  CORTADO_LIBRARY_FN(cudnnSetStream);
  CORTADO_LIBRARY_FN(cudnnGetErrorString);
  CORTADO_LIBRARY_FN(cudnnGetLastErrorString);
  CORTADO_LIBRARY_FN(cudnnGetVersion);
  // cuDNN's graph (backend) API: descriptors, operation graphs, heuristics, plans, execution.
  CORTADO_LIBRARY_FN(cudnnBackendCreateDescriptor);
  CORTADO_LIBRARY_FN(cudnnBackendDestroyDescriptor);
  CORTADO_LIBRARY_FN(cudnnBackendSetAttribute);
  CORTADO_LIBRARY_FN(cudnnBackendGetAttribute);
  CORTADO_LIBRARY_FN(cudnnBackendFinalize);
  CORTADO_LIBRARY_FN(cudnnBackendExecute);
  // cuBLASLt: the handle, matmul descriptors, layouts, preferences, heuristics, the product.
  CORTADO_LIBRARY_FN(cublasLtCreate);
  CORTADO_LIBRARY_FN(cublasLtGetVersion);
  CORTADO_LIBRARY_FN(cublasLtMatmulDescCreate);
  CORTADO_LIBRARY_FN(cublasLtMatmulDescDestroy);
  CORTADO_LIBRARY_FN(cublasLtMatmulDescSetAttribute);
  CORTADO_LIBRARY_FN(cublasLtMatmulDescGetAttribute);
  CORTADO_LIBRARY_FN(cublasLtMatrixLayoutCreate);
  CORTADO_LIBRARY_FN(cublasLtMatrixLayoutDestroy);
  CORTADO_LIBRARY_FN(cublasLtMatrixLayoutGetAttribute);
  CORTADO_LIBRARY_FN(cublasLtMatmulPreferenceCreate);
  CORTADO_LIBRARY_FN(cublasLtMatmulPreferenceDestroy);
  CORTADO_LIBRARY_FN(cublasLtMatmulPreferenceSetAttribute);
  CORTADO_LIBRARY_FN(cublasLtMatmulAlgoGetHeuristic);
  CORTADO_LIBRARY_FN(cublasLtMatmul);
  // cuBLAS: the words for a status.
  CORTADO_LIBRARY_FN(cublasGetStatusName);
  CORTADO_LIBRARY_FN(cublasGetStatusString);
};
#undef CORTADO_LIBRARY_FN

// Loads the libraries on first call (thread-safe); throws naming what is missing.
const CudaLibraries& Libraries();

}  // namespace cortado::cuda
