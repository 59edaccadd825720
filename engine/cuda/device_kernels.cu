// The shared element-wise bodies (engine/tensor/kernel_bodies.h) as CUDA kernels: a grid-stride
// loop around the same ElementAt call the host and the test device make; queued on the GPU's
// compute stream. Reached by name from engine/tensor/device_kernels.cpp.
#include "engine/base/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_context.h"
#include "engine/tensor/dtype.h"
#include "engine/tensor/kernel_bodies.h"

namespace cortado::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t count) {
  const int64_t wanted = (count + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < 4096 ? (wanted > 0 ? wanted : 1) : 4096);
}

template <typename T>
__global__ void ElementKernel(kernels::ElementOp op, kernels::ElementArgs args, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    kernels::ElementAt<T>(op, args, i);
  }
}

}  // namespace

void LaunchElementOp(int device, DType dtype, kernels::ElementOp op,
                     const kernels::ElementArgs& args, int64_t n) {
  if (n == 0) return;
  CudaContext& ctx = CudaContext::Get(device);
  ctx.MakeCurrent();
  if (dtype == DType::kF32) {
    ElementKernel<float><<<Blocks(n), kThreads, 0, ctx.compute_stream()>>>(op, args, n);
  } else if (dtype == DType::kF64) {
    ElementKernel<double><<<Blocks(n), kThreads, 0, ctx.compute_stream()>>>(op, args, n);
  } else {
    Fail("element-wise kernel on cuda:", device, ": dtype ", DTypeName(dtype),
         " (f32 or f64 only)");
  }
  CORTADO_CUDA_LAUNCH();
}

}  // namespace cortado::cuda
