// The codecs on a GPU (cortado/dist/codec_device.h) against the CPU's, bit for bit: bytes,
// residuals, decoded and accumulated values, every codec and rounding mode, at the counts the
// collectives use (0, 1, 7, 9, 2^20 + 3) and stream positions past 2^32. Every test skips, saying
// why, where no GPU can be used.
#include "cortado/dist/codec_device.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cortado/dist/codec.h"
#include "cortado/dist/types.h"

namespace cortado::dist {
namespace {

// Device memory holding a copy of a host vector, freed at scope end.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, n_ * sizeof(T) + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  T* get() { return static_cast<T*>(ptr_); }
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t n_;
};

class CodecOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device ("
                   << (status != cudaSuccess ? cudaGetErrorString(status) : "none on this machine")
                   << ")";
    }
  }
};

std::vector<float> Gradient(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = i % 5 == 0 ? BitsToFloat(bits(gen)) : normal(gen) * static_cast<float>(1 << (i % 6 * 3));
  }
  if (n > 3) {
    x[1] = std::numeric_limits<float>::infinity();
    x[2] = std::numeric_limits<float>::quiet_NaN();
    x[3] = 65520.0f;
  }
  return x;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  // (memcmp of empty vectors would pass it null pointers)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

TEST_F(CodecOnDevice, EveryCodecRoundingAndResidualMatchesTheCpu) {
  ASSERT_TRUE(DeviceCodecsBuilt());
  for (CodecKind kind : {CodecKind::kF32, CodecKind::kF16, CodecKind::kBF16, CodecKind::kEpgc11,
                         CodecKind::kEpgc9, CodecKind::kEpgc8}) {
    for (Rounding rounding : {Rounding::kNearest, Rounding::kTruncate, Rounding::kStochastic}) {
      for (bool residual : {false, true}) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{9}, (size_t{1} << 20) + 3}) {
          SCOPED_TRACE(testing::Message() << CodecName(kind) << " " << RoundingName(rounding)
                                          << (residual ? " residual" : "") << " n=" << n);
          const std::vector<float> x = Gradient(n, static_cast<uint32_t>(n) + 17);
          const EncodeOptions o{rounding, 42, (uint64_t{1} << 32) - 1000};
          std::vector<uint8_t> cpu(EncodedBytes(kind, n));
          std::vector<float> cpu_res(n, 0.5f);
          Encode(kind, x.data(), n, cpu.data(), o, residual ? cpu_res.data() : nullptr);

          DeviceBuffer<float> dx{x}, dres{std::vector<float>(n, 0.5f)};
          DeviceBuffer<uint8_t> dcodes{std::vector<uint8_t>(cpu.size())};
          EncodeOnDevice(kind, dx.get(), n, dcodes.get(), o, residual ? dres.get() : nullptr,
                         nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ASSERT_EQ(dcodes.ToHost(), cpu);
          ASSERT_TRUE(SameBits(dres.ToHost(), cpu_res));

          std::vector<float> cpu_out(n);
          Decode(kind, cpu.data(), n, cpu_out.data());
          DeviceBuffer<float> dout{std::vector<float>(n)};
          DecodeOnDevice(kind, dcodes.get(), n, dout.get(), nullptr);
          std::vector<float> cpu_acc = Gradient(n, 3);
          DeviceBuffer<float> dacc(cpu_acc);
          DecodeAccumulate(kind, cpu.data(), n, cpu_acc.data());
          DecodeAccumulateOnDevice(kind, dcodes.get(), n, dacc.get(), nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ASSERT_TRUE(SameBits(dout.ToHost(), cpu_out));
          ASSERT_TRUE(SameBits(dacc.ToHost(), cpu_acc));
        }
      }
    }
  }
}

}  // namespace
}  // namespace cortado::dist
