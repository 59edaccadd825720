// Tensors on a GPU against the CPU reference: copies, fills and conversions bit for bit, and the
// caching allocator's promise (no device allocation after the first step); pinned host blocks
// that queued copies read, and copies between GPUs, kept in stream order. Labeled `cuda`; every
// test skips, saying why, where there is no usable GPU (a build without CUDA, or no device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cortado/dist/half.h"
#include "engine/tensor/device_runtime.h"

namespace cortado {
namespace {

const Device kGpu{DeviceType::kCUDA, 0};

class TensorOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!DeviceUsable(kGpu, &why)) GTEST_SKIP() << why;
    runtime_ = &RuntimeFor(kGpu);
  }
  Tensor OnGpu(const Shape& shape, DType dtype) {
    return Tensor(shape, dtype, runtime_->DeviceAllocator(kGpu.index));
  }
  Tensor ToHost(const Tensor& gpu) {
    Tensor host(gpu.shape(), gpu.dtype());
    runtime_->Copy(host, gpu);
    return host;
  }
  Tensor ToGpu(const Tensor& host) {
    Tensor gpu = OnGpu(host.shape(), host.dtype());
    runtime_->Copy(gpu, host);
    return gpu;
  }
  DeviceRuntime* runtime_ = nullptr;
};

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Floats that exercise every rounding path: ties, subnormals of f16, overflow, inf, NaN.
Tensor EdgeFloats() {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -2.5f,
                               65504.0f,
                               65520.0f,
                               1e6f,
                               6.1035156e-05f,
                               5.9604645e-08f,
                               2.9802322e-08f,
                               1.0f + 1.0f / 2048,
                               1.0f + 3.0f / 2048,
                               3.0e38f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()};
  for (uint32_t i = 0; i < 100003; ++i) values.push_back(dist::BitsToFloat(i * 42949u + 17u));
  Tensor t({static_cast<int64_t>(values.size())}, DType::kF32);
  std::memcpy(t.raw_data(), values.data(), t.nbytes());
  return t;
}

TEST_F(TensorOnDevice, CopiesRoundTripEveryDtype) {
  for (DType dtype :
       {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kU8}) {
    Tensor host({3, 5, 7}, dtype);
    auto* bytes = static_cast<uint8_t*>(host.raw_data());
    for (size_t i = 0; i < host.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
    Tensor back = ToHost(ToGpu(host));
    EXPECT_TRUE(SameBytes(back, host)) << DTypeName(dtype);
  }
}

TEST_F(TensorOnDevice, FillRoundsAsTheCpuDoes) {
  for (DType dtype :
       {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kU8}) {
    for (double value : {0.0, 1.0 / 3.0, -7.0, 65519.0, 1e-7}) {
      Tensor cpu({1000003}, dtype);
      cpu.Fill(value);
      Tensor gpu = OnGpu({1000003}, dtype);
      runtime_->Fill(gpu, value);
      EXPECT_TRUE(SameBytes(ToHost(gpu), cpu)) << DTypeName(dtype) << " " << value;
    }
  }
}

TEST_F(TensorOnDevice, ConversionsMatchTheCpuBitForBit) {
  const Tensor f32 = EdgeFloats();
  for (DType narrow : {DType::kF16, DType::kBF16, DType::kF64}) {
    Tensor cpu(f32.shape(), narrow);
    cpu.ConvertFrom(f32);
    Tensor gpu = OnGpu(f32.shape(), narrow);
    runtime_->Convert(gpu, ToGpu(f32));
    EXPECT_TRUE(SameBytes(ToHost(gpu), cpu)) << "f32 -> " << DTypeName(narrow);
    // And back to f32.
    Tensor cpu_back(f32.shape(), DType::kF32);
    cpu_back.ConvertFrom(cpu);
    Tensor gpu_back = OnGpu(f32.shape(), DType::kF32);
    runtime_->Convert(gpu_back, gpu);
    EXPECT_TRUE(SameBytes(ToHost(gpu_back), cpu_back)) << DTypeName(narrow) << " -> f32";
  }
}

TEST_F(TensorOnDevice, ASecondStepAllocatesNothingFromTheDriver) {
  auto step = [&] {
    std::vector<Tensor> live;
    for (int64_t n : {1000, 250000, 3000000, 1000, 77}) live.push_back(OnGpu({n}, DType::kF32));
  };
  step();
  const MemoryStats after_first = runtime_->Memory(kGpu.index);
  step();
  step();
  const MemoryStats after_third = runtime_->Memory(kGpu.index);
  EXPECT_EQ(after_third.raw_allocations, after_first.raw_allocations);
  EXPECT_GE(after_third.cache_hits, after_first.cache_hits + 10);
}

TEST_F(TensorOnDevice, TheTensorApiWorksOnTheGpu) {
  Tensor host({4, 1000}, DType::kF32);
  host.Fill(0.1);
  Tensor gpu = host.To(kGpu);
  EXPECT_EQ(gpu.device(), kGpu);
  EXPECT_TRUE(SameBytes(gpu.To(Device::CPU()), host));
  Tensor clone = gpu.Clone();
  EXPECT_EQ(clone.device(), kGpu);
  gpu.Zero();  // the clone is a copy, not a view
  EXPECT_TRUE(SameBytes(clone.To(Device::CPU()), host));
  Tensor bf16({4, 1000}, DType::kBF16, runtime_->DeviceAllocator(kGpu.index));
  bf16.ConvertFrom(clone);
  Tensor cpu_bf16({4, 1000}, DType::kBF16);
  cpu_bf16.ConvertFrom(host);
  EXPECT_TRUE(SameBytes(bf16.To(Device::CPU()), cpu_bf16));
  EXPECT_THROW(host.CopyFrom(gpu), Error);  // across devices only through To
}

// The loader's pattern: fill a pinned batch, queue its copy, drop it, fill the next. The copies
// queue behind a long fill, so the pinned blocks are freed before their copies run; a block
// handed out again at once would be overwritten by the next batch first.
TEST_F(TensorOnDevice, PinnedBatchesArriveIntactWhileTheirBlocksAreReused) {
  Tensor busy = OnGpu({int64_t{1} << 28}, DType::kF32);  // 32 GiB written ahead of the copies
  for (int i = 0; i < 32; ++i) runtime_->Fill(busy, i);
  const int64_t n = int64_t{4} << 20;  // 16 MB batches
  std::vector<Tensor> on_gpu;
  for (int i = 0; i < 24; ++i) {
    Tensor batch({n}, DType::kF32, runtime_->PinnedHostAllocator());
    batch.Fill(i);
    on_gpu.push_back(ToGpu(batch));
  }
  for (int i = 0; i < 24; ++i) {
    const Tensor back = ToHost(on_gpu[static_cast<size_t>(i)]);
    const float* v = back.data<float>();
    ASSERT_EQ(v[0], static_cast<float>(i)) << "batch " << i;
    ASSERT_EQ(v[n - 1], static_cast<float>(i)) << "batch " << i;
  }
}

// A copy from cuda:1 to cuda:0 runs on cuda:0's stream after cuda:1's earlier work on the source,
// and cuda:1's later work on the source runs after the copy. A suite of its own: it skips on a
// machine with one GPU, which scripts/device/check.sh accepts for this suite alone.
class TensorOnTwoGpus : public TensorOnDevice {};

TEST_F(TensorOnTwoGpus, ACopyBetweenGpusKeepsBothStreamsInOrder) {
  std::string why;
  if (runtime_->DeviceCount(&why) < 2) GTEST_SKIP() << "needs two GPUs";
  const Device second{DeviceType::kCUDA, 1};
  const int64_t n = int64_t{1} << 26;  // 256 MB: long enough for the orders to matter
  Tensor src({n}, DType::kF32, runtime_->DeviceAllocator(second.index));
  Tensor dst = OnGpu({n}, DType::kF32);
  runtime_->Fill(src, 1.0);
  runtime_->Copy(dst, src);
  runtime_->Fill(src, 2.0);
  const Tensor back = ToHost(dst);
  EXPECT_EQ(back.data<float>()[0], 1.0f);
  EXPECT_EQ(back.data<float>()[n - 1], 1.0f);
}

TEST_F(TensorOnDevice, AnImpossibleAllocationNamesTheDevice) {
  try {
    OnGpu({int64_t{1} << 48}, DType::kF32);  // 1 PiB
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on cuda:0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cortado
