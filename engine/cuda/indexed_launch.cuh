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
#include "engine/tensor/launch_geometry.h"

namespace cortado::cuda {

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
  const LaunchGeometry g = IndexedLaunchGeometry(n);
  IndexedKernel<Body><<<g.blocks, g.threads, 0, ctx.compute_stream()>>>(n, body);
  CORTADO_CUDA_LAUNCH();
}

}  // namespace cortado::cuda

#define CORTADO_CUDA_INDEXED(...) \
  template void ::cortado::cuda::LaunchIndexed<__VA_ARGS__>(int, int64_t, const __VA_ARGS__&);
