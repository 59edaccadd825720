// The CUDA side of RunIndexed (engine/tensor/indexed_launch.h): a grid-stride loop around the
// body, queued on the GPU's compute stream. A .cu file that defines bodies' launches includes
// this and names each body type once:
//
//   CORTADO_CUDA_INDEXED(cortado::kernels::MaxPoolForward<float>)
//
// (an explicit instantiation; a body launched without one fails to link in a CUDA build).
#pragma once

#include <cstdint>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_context.h"

namespace cortado::cuda {

inline constexpr int kIndexedThreads = 256;

template <class Body>
__global__ void IndexedKernel(int64_t n, Body body) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    body(i);
  }
}

template <class Body>
void LaunchIndexed(int device, int64_t n, const Body& body) {
  if (n <= 0) return;
  CudaContext& ctx = CudaContext::Get(device);
  ctx.MakeCurrent();
  const int64_t wanted = (n + kIndexedThreads - 1) / kIndexedThreads;
  const int blocks = static_cast<int>(wanted < 65536 ? wanted : 65536);
  IndexedKernel<Body><<<blocks, kIndexedThreads, 0, ctx.compute_stream()>>>(n, body);
  CORTADO_CUDA_LAUNCH();
}

}  // namespace cortado::cuda

#define CORTADO_CUDA_INDEXED(...) \
  template void ::cortado::cuda::LaunchIndexed<__VA_ARGS__>(int, int64_t, const __VA_ARGS__&);
