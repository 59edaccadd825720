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
  void* cudnn = Open("libcudnn.so.9");
  Resolve(cudnn, "libcudnn.so.9", "cudnnCreate", l.cudnnCreate);
  Resolve(cudnn, "libcudnn.so.9", "cudnnSetStream", l.cudnnSetStream);
  Resolve(cudnn, "libcudnn.so.9", "cudnnGetErrorString", l.cudnnGetErrorString);
  void* lt = Open("libcublasLt.so.13");
  Resolve(lt, "libcublasLt.so.13", "cublasLtCreate", l.cublasLtCreate);
  void* blas = Open("libcublas.so.13");
  Resolve(blas, "libcublas.so.13", "cublasGetStatusName", l.cublasGetStatusName);
  Resolve(blas, "libcublas.so.13", "cublasGetStatusString", l.cublasGetStatusString);
  return l;
}

}  // namespace

const CudaLibraries& Libraries() {
  static const CudaLibraries libraries = Load();  // never unloaded: see cuda_context.h
  return libraries;
}

}  // namespace cortado::cuda
