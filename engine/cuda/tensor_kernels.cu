#include "cortado/dist/half.h"
#include "engine/base/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/tensor_kernels.h"

namespace cortado::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t count) {
  // Grid-stride loops below: enough blocks to fill an H200 (132 SMs) several times over.
  const int64_t wanted = (count + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < 4096 ? (wanted > 0 ? wanted : 1) : 4096);
}

// Loads and stores through f32 (f64 stays f64), matching the CPU's conversions.
template <DType D>
struct Element;
template <>
struct Element<DType::kF32> {
  using Storage = float;
  __device__ static double Load(float v) { return v; }
  __device__ static float Store(double v) { return static_cast<float>(v); }
};
template <>
struct Element<DType::kF64> {
  using Storage = double;
  __device__ static double Load(double v) { return v; }
  __device__ static double Store(double v) { return v; }
};
template <>
struct Element<DType::kF16> {
  using Storage = uint16_t;
  __device__ static double Load(uint16_t v) { return dist::HalfToFloat(v); }
  __device__ static uint16_t Store(double v) { return dist::FloatToHalf(static_cast<float>(v)); }
};
template <>
struct Element<DType::kBF16> {
  using Storage = uint16_t;
  __device__ static double Load(uint16_t v) { return dist::BFloat16ToFloat(v); }
  __device__ static uint16_t Store(double v) {
    return dist::FloatToBFloat16(static_cast<float>(v));
  }
};
template <>
struct Element<DType::kI32> {
  using Storage = int32_t;
  __device__ static double Load(int32_t v) { return v; }
  __device__ static int32_t Store(double v) { return static_cast<int32_t>(v); }
};
template <>
struct Element<DType::kU8> {
  using Storage = uint8_t;
  __device__ static double Load(uint8_t v) { return v; }
  __device__ static uint8_t Store(double v) { return static_cast<uint8_t>(v); }
};

template <typename T>
__global__ void FillKernel(T* data, int64_t count, T value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    data[i] = value;
  }
}

template <DType To, DType From>
__global__ void ConvertKernel(typename Element<To>::Storage* dst,
                              const typename Element<From>::Storage* src, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = Element<To>::Store(Element<From>::Load(src[i]));
  }
}

template <DType D>
void Fill(void* data, int64_t count, double value, cudaStream_t stream) {
  using T = typename Element<D>::Storage;
  // The value is rounded once, on the host, exactly as Tensor::Fill rounds it.
  T rounded;
  if constexpr (D == DType::kF16) {
    rounded = dist::FloatToHalf(static_cast<float>(value));
  } else if constexpr (D == DType::kBF16) {
    rounded = dist::FloatToBFloat16(static_cast<float>(value));
  } else {
    rounded = static_cast<T>(value);
  }
  FillKernel<<<Blocks(count), kThreads, 0, stream>>>(static_cast<T*>(data), count, rounded);
  CORTADO_CUDA_LAUNCH();
}

template <DType To, DType From>
void Convert(void* dst, const void* src, int64_t count, cudaStream_t stream) {
  ConvertKernel<To, From><<<Blocks(count), kThreads, 0, stream>>>(
      static_cast<typename Element<To>::Storage*>(dst),
      static_cast<const typename Element<From>::Storage*>(src), count);
  CORTADO_CUDA_LAUNCH();
}

template <DType To>
void ConvertTo(void* dst, const void* src, DType src_dtype, int64_t count, cudaStream_t stream) {
  switch (src_dtype) {
    case DType::kF32:
      return Convert<To, DType::kF32>(dst, src, count, stream);
    case DType::kF64:
      return Convert<To, DType::kF64>(dst, src, count, stream);
    case DType::kF16:
      return Convert<To, DType::kF16>(dst, src, count, stream);
    case DType::kBF16:
      return Convert<To, DType::kBF16>(dst, src, count, stream);
    default:
      Fail("cannot convert ", DTypeName(src_dtype), " on a GPU (floating types only)");
  }
}

}  // namespace

void LaunchFill(void* data, DType dtype, int64_t count, double value, cudaStream_t stream) {
  if (count == 0) return;
  switch (dtype) {
    case DType::kF32:
      return Fill<DType::kF32>(data, count, value, stream);
    case DType::kF64:
      return Fill<DType::kF64>(data, count, value, stream);
    case DType::kF16:
      return Fill<DType::kF16>(data, count, value, stream);
    case DType::kBF16:
      return Fill<DType::kBF16>(data, count, value, stream);
    case DType::kI32:
      return Fill<DType::kI32>(data, count, value, stream);
    case DType::kU8:
      return Fill<DType::kU8>(data, count, value, stream);
  }
}

void LaunchConvert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t count,
                   cudaStream_t stream) {
  if (count == 0) return;
  switch (dst_dtype) {
    case DType::kF32:
      return ConvertTo<DType::kF32>(dst, src, src_dtype, count, stream);
    case DType::kF64:
      return ConvertTo<DType::kF64>(dst, src, src_dtype, count, stream);
    case DType::kF16:
      return ConvertTo<DType::kF16>(dst, src, src_dtype, count, stream);
    case DType::kBF16:
      return ConvertTo<DType::kBF16>(dst, src, src_dtype, count, stream);
    default:
      Fail("cannot convert into ", DTypeName(dst_dtype), " on a GPU (floating types only)");
  }
}

}  // namespace cortado::cuda
