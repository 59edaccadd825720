// Batches staged for a net on a device (tools/device_feed.h): through pinned host memory, queued
// without waiting for the device, converted and reordered into the net's input dtype and layout.
#include "tools/device_feed.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

#include "engine/base/random.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/test_device.h"
#include "models/builders.h"

namespace cortado {
namespace {

const Device kTest0{DeviceType::kTest, 0};

std::unique_ptr<Net> LeNetOn(Device device, DType dtype, MemoryFormat layout) {
  ModelOptions o;
  o.num_classes = 10;
  o.in_channels = 1;
  o.height = o.width = 28;
  o.batch_size = 4;
  NetOptions options;
  options.device = device;
  options.layout = layout;
  return std::make_unique<Net>(BuildModel("lenet", o), 1, dtype, options);
}

// An NCHW f32 batch of 4 (the loader's form when the net is NCHW) with labels below 10.
Batch MakeBatch(uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.images = Tensor({4, 1, 28, 28}, DType::kF32);
  for (int64_t i = 0; i < b.images.numel(); ++i) {
    b.images.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
  }
  b.labels = Tensor({4}, DType::kI32);
  for (int i = 0; i < 4; ++i) b.labels.data<int32_t>()[i] = static_cast<int32_t>(rng.Below(10));
  b.size = 4;
  return b;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(DeviceFeed, AStagedBatchIsTheBatchInTheNetsDtypeOnItsDevice) {
  for (DType dtype : {DType::kF32, DType::kF64}) {
    std::unique_ptr<Net> owned = LeNetOn(kTest0, dtype, MemoryFormat::kNCHW);
    Net& net = *owned;
    const Batch batch = MakeBatch(7);
    StagedBatch staged = StageBatch(net, batch);
    ASSERT_EQ(staged.images.device(), kTest0);
    ASSERT_EQ(staged.images.dtype(), dtype);
    Tensor want(batch.images.shape(), dtype);
    want.ConvertFrom(batch.images);
    EXPECT_TRUE(SameBytes(staged.images.To(Device::CPU()), want));
    EXPECT_TRUE(SameBytes(staged.labels.To(Device::CPU()), batch.labels));
    FeedStaged(net, staged);
    EXPECT_TRUE(net.input("data").SharesStorageWith(staged.images));
    EXPECT_TRUE(net.input("label").SharesStorageWith(staged.labels));
  }
}

TEST(DeviceFeed, ABatchInAnotherLayoutIsReorderedOnTheHost) {
  // A 3-channel net in NHWC fed an NCHW batch: the staged images are the batch reordered.
  ModelOptions o;
  o.num_classes = 10;
  o.in_channels = 3;
  o.height = o.width = 16;
  o.batch_size = 2;
  NetOptions options;
  options.device = kTest0;
  options.layout = MemoryFormat::kNHWC;
  Net net(BuildModel("resnet20", o), 1, DType::kF32, options);
  Batch batch;
  batch.images = Tensor({2, 3, 16, 16}, DType::kF32);
  for (int64_t i = 0; i < batch.images.numel(); ++i) {
    batch.images.data<float>()[i] = static_cast<float>(i % 97) / 97;
  }
  batch.labels = Tensor({2}, DType::kI32);
  batch.labels.Zero();
  const StagedBatch staged = StageBatch(net, batch);
  EXPECT_EQ(staged.images.format(), MemoryFormat::kNHWC);
  EXPECT_TRUE(
      SameBytes(staged.images.To(Device::CPU()), batch.images.Reordered(MemoryFormat::kNHWC)));
}

TEST(DeviceFeed, StagingQueuesTheCopiesWithoutWaitingForTheDevice) {
  std::unique_ptr<Net> owned = LeNetOn(kTest0, DType::kF32, MemoryFormat::kNCHW);
  Net& net = *owned;
  const Batch batch = MakeBatch(8);
  // A kernel that holds the test device's stream until released: work queued behind it waits.
  std::atomic<bool> release{false};
  LaunchOnTestDevice(kTest0, {}, [&release] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  auto staging = std::async(std::launch::async, [&] { return StageBatch(net, batch); });
  // Staging returns while the device is still busy: its copies are queued, not waited for.
  const bool returned = staging.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  release = true;
  ASSERT_TRUE(returned) << "StageBatch waited for the device";
  const StagedBatch staged = staging.get();
  EXPECT_TRUE(SameBytes(staged.images.To(Device::CPU()), batch.images));
}

TEST(DeviceFeed, ImagesThatDoNotFitTheNetAreOneLineNamingBothShapes) {
  std::unique_ptr<Net> owned = LeNetOn(kTest0, DType::kF32, MemoryFormat::kNCHW);
  Net& net = *owned;
  Batch batch = MakeBatch(9);
  batch.images = Tensor({4, 3, 28, 28}, DType::kF32);
  batch.images.Zero();
  try {
    StageBatch(net, batch);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32[4, 3, 28, 28] but the net expects [N, 1, 28, 28]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cortado
