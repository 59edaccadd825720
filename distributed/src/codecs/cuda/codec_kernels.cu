// The CUDA kernels of the gradient codecs: one thread per group of 8 values, running
// codec_values.h's group functions, which the host tests hold to the CPU kernels bit for bit.
#include <cuda_runtime_api.h>

#include <string>

#include "codecs/codec_values.h"
#include "cortado/dist/codec_device.h"
#include "cortado/dist/error.h"

namespace cortado::dist {
namespace {

using codec_internal::GroupByteOffset;

constexpr int kThreads = 256;

void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    Fail(ErrorKind::kSystem, what, " failed on the GPU: ", cudaGetErrorName(status), " (",
         cudaGetErrorString(status), ")");
  }
}

unsigned Blocks(size_t groups) {
  const size_t blocks = (groups + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

template <CodecKind K, Rounding R, bool kResidual>
__global__ void EncodeKernel(const float* src, size_t count, uint8_t* dst, uint64_t seed,
                             uint64_t first_index, float* residual) {
  const size_t group = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  const size_t first = group * 8;
  if (first >= count) return;
  const int k = count - first < 8 ? static_cast<int>(count - first) : 8;
  codec_internal::EncodeGroup<K, R, kResidual>(src + first, k, dst + GroupByteOffset<K>(group),
                                               seed, first_index + first,
                                               kResidual ? residual + first : nullptr);
}

template <CodecKind K, bool kAccumulate>
__global__ void DecodeKernel(const uint8_t* src, size_t count, float* dst) {
  const size_t group = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  const size_t first = group * 8;
  if (first >= count) return;
  const int k = count - first < 8 ? static_cast<int>(count - first) : 8;
  codec_internal::DecodeGroup<K, kAccumulate>(src + GroupByteOffset<K>(group), k, dst + first);
}

// f32 accumulates value by value (encoding f32 is a copy).
__global__ void AccumulateF32Kernel(const uint8_t* src, size_t count, float* acc) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= count) return;
  float v;
  memcpy(&v, src + 4 * i, 4);
  acc[i] = __fadd_rn(acc[i], v);
}

template <CodecKind K>
void Encode(const float* src, size_t count, uint8_t* dst, const EncodeOptions& o, float* residual,
            cudaStream_t stream) {
  const size_t groups = (count + 7) / 8;
  auto launch = [&](auto kernel) {
    kernel<<<Blocks(groups), kThreads, 0, stream>>>(src, count, dst, o.seed, o.first_index,
                                                    residual);
  };
  const bool r = residual != nullptr;
  switch (o.rounding) {
    case Rounding::kNearest:
      return r ? launch(EncodeKernel<K, Rounding::kNearest, true>)
               : launch(EncodeKernel<K, Rounding::kNearest, false>);
    case Rounding::kTruncate:
      return r ? launch(EncodeKernel<K, Rounding::kTruncate, true>)
               : launch(EncodeKernel<K, Rounding::kTruncate, false>);
    case Rounding::kStochastic:
      return r ? launch(EncodeKernel<K, Rounding::kStochastic, true>)
               : launch(EncodeKernel<K, Rounding::kStochastic, false>);
  }
}

template <CodecKind K>
void Decode(const uint8_t* src, size_t count, float* dst, bool accumulate, cudaStream_t stream) {
  const size_t groups = (count + 7) / 8;
  if (accumulate) {
    DecodeKernel<K, true><<<Blocks(groups), kThreads, 0, stream>>>(src, count, dst);
  } else {
    DecodeKernel<K, false><<<Blocks(groups), kThreads, 0, stream>>>(src, count, dst);
  }
}

void DecodeAny(CodecKind kind, const void* src, size_t count, float* dst, bool accumulate,
               cudaStream_t stream) {
  const auto* in = static_cast<const uint8_t*>(src);
  switch (kind) {
    case CodecKind::kF32:
      if (accumulate) {
        AccumulateF32Kernel<<<Blocks(count), kThreads, 0, stream>>>(in, count, dst);
      } else {
        Check(cudaMemcpyAsync(dst, src, count * 4, cudaMemcpyDeviceToDevice, stream),
              "f32 decode (copy)");
      }
      break;
    case CodecKind::kF16:
      Decode<CodecKind::kF16>(in, count, dst, accumulate, stream);
      break;
    case CodecKind::kBF16:
      Decode<CodecKind::kBF16>(in, count, dst, accumulate, stream);
      break;
    case CodecKind::kEpgc11:
      Decode<CodecKind::kEpgc11>(in, count, dst, accumulate, stream);
      break;
    case CodecKind::kEpgc9:
      Decode<CodecKind::kEpgc9>(in, count, dst, accumulate, stream);
      break;
    case CodecKind::kEpgc8:
      Decode<CodecKind::kEpgc8>(in, count, dst, accumulate, stream);
      break;
  }
  Check(cudaGetLastError(),
        accumulate ? "decode-accumulate kernel launch" : "decode kernel launch");
}

}  // namespace

bool DeviceCodecsBuilt() { return true; }

void EncodeOnDevice(CodecKind kind, const float* src, size_t count, void* dst,
                    const EncodeOptions& options, float* residual, void* stream_ptr) {
  if (count == 0) return;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  auto* out = static_cast<uint8_t*>(dst);
  switch (kind) {
    case CodecKind::kF32:  // lossless: a copy, the residual untouched
      Check(cudaMemcpyAsync(dst, src, count * 4, cudaMemcpyDeviceToDevice, stream),
            "f32 encode (copy)");
      return;
    case CodecKind::kF16:
      Encode<CodecKind::kF16>(src, count, out, options, residual, stream);
      break;
    case CodecKind::kBF16:
      Encode<CodecKind::kBF16>(src, count, out, options, residual, stream);
      break;
    case CodecKind::kEpgc11:
      Encode<CodecKind::kEpgc11>(src, count, out, options, residual, stream);
      break;
    case CodecKind::kEpgc9:
      Encode<CodecKind::kEpgc9>(src, count, out, options, residual, stream);
      break;
    case CodecKind::kEpgc8:
      Encode<CodecKind::kEpgc8>(src, count, out, options, residual, stream);
      break;
  }
  Check(cudaGetLastError(), "encode kernel launch");
}

void DecodeOnDevice(CodecKind kind, const void* src, size_t count, float* dst, void* stream) {
  if (count > 0) DecodeAny(kind, src, count, dst, false, static_cast<cudaStream_t>(stream));
}

void DecodeAccumulateOnDevice(CodecKind kind, const void* src, size_t count, float* acc,
                              void* stream) {
  if (count > 0) DecodeAny(kind, src, count, acc, true, static_cast<cudaStream_t>(stream));
}

}  // namespace cortado::dist
