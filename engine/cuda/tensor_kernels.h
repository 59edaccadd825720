// Element-wise kernels behind DeviceRuntime::Fill and Convert, queued on `stream`. Values are
// rounded exactly as the CPU's Tensor::Fill and ConvertFrom round them (cortado/dist/half.h, the
// same code on host and device).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/tensor/dtype.h"

namespace cortado::cuda {

// Sets `count` elements of `dtype` at `data` to value (narrowed through f32 for f16 and bf16,
// as Tensor::Fill does).
void LaunchFill(void* data, DType dtype, int64_t count, double value, cudaStream_t stream);

// dst[i] = src[i] converted between f32, f64, f16 and bf16.
void LaunchConvert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t count,
                   cudaStream_t stream);

}  // namespace cortado::cuda
