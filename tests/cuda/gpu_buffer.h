// Test helper for the GPU tests of engine/cuda/: raw device memory, host data in and out, and
// fills, all on GPU 0's compute stream (where cuDNN and cuBLASLt run), each call waiting for its
// work to finish. Also the values those tests use: k/64 for k in [-64, 64], exact in f32, TF32,
// f16 and bf16 alike, so a reference in f64 sees exactly what each kernel reads.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cortado/dist/half.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/tensor_kernels.h"
#include "engine/tensor/dtype.h"

namespace cortado::testing {

class GpuBuffer {
 public:
  explicit GpuBuffer(size_t bytes) : bytes_(bytes) {
    Context().MakeCurrent();
    CORTADO_CUDA_CHECK(cudaMalloc(&data_, bytes == 0 ? 1 : bytes));
  }
  ~GpuBuffer() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;

  void* get() const { return data_; }
  size_t bytes() const { return bytes_; }

  void Upload(const void* host, size_t bytes, size_t offset = 0) {
    CORTADO_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(data_) + offset, host, bytes,
                                       cudaMemcpyHostToDevice, Context().compute_stream()));
    Sync();
  }
  void Download(void* host, size_t bytes, size_t offset = 0) const {
    CORTADO_CUDA_CHECK(cudaMemcpyAsync(host, static_cast<const char*>(data_) + offset, bytes,
                                       cudaMemcpyDeviceToHost, Context().compute_stream()));
    Sync();
  }
  // `count` elements of `dtype` set to value (rounded as Tensor::Fill rounds).
  void Fill(DType dtype, int64_t count, double value) {
    cuda::LaunchFill(data_, dtype, count, value, Context().compute_stream());
    Sync();
  }

  static cuda::CudaContext& Context() { return cuda::CudaContext::Get(0); }
  // Waits for everything queued on the compute stream (the convolution or product under test).
  static void Sync() { CORTADO_CUDA_CHECK(cudaStreamSynchronize(Context().compute_stream())); }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

// `count` values k/64, k uniform in [-64, 64].
inline std::vector<double> SixtyFourths(size_t count, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(-64, 64);
  std::vector<double> values(count);
  for (double& v : values) v = k(rng) / 64.0;
  return values;
}

// Values as the bytes of `dtype` (f32, f16 or bf16), and back.
inline std::vector<uint8_t> ToBytes(const std::vector<double>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    if (dtype == DType::kF32) {
      std::memcpy(&bytes[i * 4], &f, 4);
    } else {
      const uint16_t bits = dtype == DType::kF16 ? dist::FloatToHalf(f) : dist::FloatToBFloat16(f);
      std::memcpy(&bytes[i * 2], &bits, 2);
    }
  }
  return bytes;
}

inline std::vector<double> FromBytes(const std::vector<uint8_t>& bytes, DType dtype) {
  const size_t size = DTypeSize(dtype);
  std::vector<double> values(bytes.size() / size);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      values[i] = f;
    } else {
      uint16_t bits;
      std::memcpy(&bits, &bytes[i * 2], 2);
      values[i] = dtype == DType::kF16 ? dist::HalfToFloat(bits) : dist::BFloat16ToFloat(bits);
    }
  }
  return values;
}

// `value` rounded to `dtype` as the kernels round their output.
inline double RoundTo(double value, DType dtype) {
  return FromBytes(ToBytes({value}, dtype), dtype)[0];
}

}  // namespace cortado::testing
