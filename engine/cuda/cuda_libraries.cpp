#include "engine/cuda/cuda_libraries.h"

#include <dlfcn.h>

#include <string>

#include "engine/base/error.h"

namespace cortado::cuda {
namespace {

void* Open(const char* soname) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    Fail("cannot load ", soname, " (", why != nullptr ? why : "unknown reason",
         "): install the CUDA toolkit's cuDNN 9 and cuBLAS, or add their folder to "
         "LD_LIBRARY_PATH");
  }
  return handle;
}

template <typename Fn>
void Resolve(void* handle, const char* soname, const char* name, Fn*& fn) {
  fn = reinterpret_cast<Fn*>(dlsym(handle, name));
  CORTADO_CHECK(fn != nullptr, "cannot find ", name, " in ", soname);
}

CudaLibraries Load() {
  CudaLibraries l{};
  const char* soname = "libcudnn.so.9";
  void* lib = Open(soname);
#define CORTADO_RESOLVE(name) Resolve(lib, soname, #name, l.name)
  CORTADO_RESOLVE(cudnnCreate);
  CORTADO_RESOLVE(cudnnSetStream);
  CORTADO_RESOLVE(cudnnGetErrorString);
  CORTADO_RESOLVE(cudnnGetLastErrorString);
  CORTADO_RESOLVE(cudnnGetVersion);
  CORTADO_RESOLVE(cudnnBackendCreateDescriptor);
  CORTADO_RESOLVE(cudnnBackendDestroyDescriptor);
  CORTADO_RESOLVE(cudnnBackendSetAttribute);
  CORTADO_RESOLVE(cudnnBackendGetAttribute);
  CORTADO_RESOLVE(cudnnBackendFinalize);
  CORTADO_RESOLVE(cudnnBackendExecute);
  soname = "libcublasLt.so.13";
  lib = Open(soname);
  CORTADO_RESOLVE(cublasLtCreate);
  CORTADO_RESOLVE(cublasLtGetVersion);
  CORTADO_RESOLVE(cublasLtMatmulDescCreate);
  CORTADO_RESOLVE(cublasLtMatmulDescDestroy);
  CORTADO_RESOLVE(cublasLtMatmulDescSetAttribute);
  CORTADO_RESOLVE(cublasLtMatmulDescGetAttribute);
  CORTADO_RESOLVE(cublasLtMatrixLayoutCreate);
  CORTADO_RESOLVE(cublasLtMatrixLayoutDestroy);
  CORTADO_RESOLVE(cublasLtMatrixLayoutGetAttribute);
  CORTADO_RESOLVE(cublasLtMatmulPreferenceCreate);
  CORTADO_RESOLVE(cublasLtMatmulPreferenceDestroy);
  CORTADO_RESOLVE(cublasLtMatmulPreferenceSetAttribute);
  CORTADO_RESOLVE(cublasLtMatmulAlgoGetHeuristic);
  CORTADO_RESOLVE(cublasLtMatmul);
  soname = "libcublas.so.13";
  lib = Open(soname);
  CORTADO_RESOLVE(cublasGetStatusName);
  CORTADO_RESOLVE(cublasGetStatusString);
#undef CORTADO_RESOLVE
  return l;
}

}  // namespace

const CudaLibraries& Libraries() {
  static const CudaLibraries libraries = Load();  // never unloaded: see cuda_context.h
  return libraries;
}

}  // namespace cortado::cuda
