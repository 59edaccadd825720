#include "engine/cuda/cuda_check.h"

#include <cstring>

#include "engine/base/error.h"
#include "engine/cuda/cuda_libraries.h"

namespace cortado::cuda {
namespace {

// The file relative to the repository, as a user would look for it.
const char* RepoPath(const char* file) {
  const char* engine = std::strstr(file, "engine/");
  return engine != nullptr ? engine : file;
}

}  // namespace

void FailCuda(cudaError_t status, const char* call, const char* file, int line) {
  Fail(call, " failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") at ",
       RepoPath(file), ":", line);
}

void FailCudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  Fail(call, " failed: ", Libraries().cudnnGetErrorString(status), " at ", RepoPath(file), ":",
       line);
}

void FailCublas(cublasStatus_t status, const char* call, const char* file, int line) {
  Fail(call, " failed: ", Libraries().cublasGetStatusName(status), " (",
       Libraries().cublasGetStatusString(status), ") at ", RepoPath(file), ":", line);
}

}  // namespace cortado::cuda
