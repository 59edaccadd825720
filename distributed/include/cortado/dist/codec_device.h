// The gradient codecs on a GPU: Encode, Decode and DecodeAccumulate over device memory, giving
// the bytes, residuals and values the CPU codecs give (cortado/dist/codec.h) bit for bit, for
// every codec and rounding mode (stochastic rounding draws the same random words from the same
// seed and stream index). Queued on `stream` (a cudaStream_t, passed as void* so this header
// needs no CUDA include; null is the default stream); src, dst and residual are device
// pointers, dst at any byte offset.
//
// Built where the library is built with CUDA (CORTADO_DIST_CUDA, on by default where nvcc is
// found); elsewhere DeviceCodecsBuilt() is false and the calls throw.
#pragma once

#include <cstddef>

#include "cortado/dist/codec.h"

namespace cortado::dist {

bool DeviceCodecsBuilt();

void EncodeOnDevice(CodecKind kind, const float* src, size_t count, void* dst,
                    const EncodeOptions& options, float* residual, void* stream);
void DecodeOnDevice(CodecKind kind, const void* src, size_t count, float* dst, void* stream);
void DecodeAccumulateOnDevice(CodecKind kind, const void* src, size_t count, float* acc,
                              void* stream);

}  // namespace cortado::dist
