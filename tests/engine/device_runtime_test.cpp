// Device names and what the engine says where a device cannot be used; runs on every machine.
#include "engine/tensor/device_runtime.h"

#include <gtest/gtest.h>

namespace cortado {
namespace {

TEST(DeviceRuntime, ParsesCpuCudaAndCudaN) {
  EXPECT_EQ(ParseDevice("cpu"), Device::CPU());
  EXPECT_EQ(ParseDevice("cuda"), (Device{DeviceType::kCUDA, 0}));
  EXPECT_EQ(ParseDevice("cuda:3"), (Device{DeviceType::kCUDA, 3}));
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CUDA", ""}) {
    try {
      ParseDevice(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("device '") + bad +
                                           "' is not one of: cpu, "
                                           "cuda, cuda:N"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(DeviceRuntime, TheCpuIsAlwaysUsable) {
  std::string why;
  EXPECT_TRUE(DeviceUsable(Device::CPU(), &why));
  EXPECT_TRUE(why.empty());
}

TEST(DeviceRuntime, AGpuThatIsNotThereIsRefusedSayingWhy) {
  // cuda:1000 exists nowhere: refused in a build without CUDA, on a machine without a GPU and on
  // one with fewer than 1001 GPUs, each time with a reason.
  std::string why;
  EXPECT_FALSE(DeviceUsable(Device{DeviceType::kCUDA, 1000}, &why));
  EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
  try {
    RuntimeFor(Device{DeviceType::kCUDA, 1000});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot use cuda:1000: "), std::string::npos) << e.what();
  }
}

TEST(DeviceRuntime, ATensorStaysOnTheCpuAndCannotGoWhereNoGpuIs) {
  Tensor t({3}, DType::kF32);
  t.Fill(2.0);
  Tensor same = t.To(Device::CPU());
  EXPECT_TRUE(same.SharesStorageWith(t));
  EXPECT_THROW(t.To(Device{DeviceType::kCUDA, 1000}), Error);
}

}  // namespace
}  // namespace cortado
