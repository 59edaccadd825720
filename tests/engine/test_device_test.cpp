// The guarded host-memory test device (engine/tensor/test_device.h) and the device-safe core:
// host access of device memory is refused with a message, or faults where it slips through.
#include "engine/tensor/test_device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

#include "engine/graph/layer.h"

namespace cortado {
namespace {

const Device kTest0{DeviceType::kTest, 0};
const Device kTest1{DeviceType::kTest, 1};

Tensor Iota(const Shape& shape, DType dtype = DType::kF32) {
  Tensor t(shape, DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = 0.25 * static_cast<double>(i) - 3;
  Tensor out(shape, dtype);
  out.ConvertFrom(t);
  return out;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TestDevice, NamesParseAndPrint) {
  EXPECT_EQ(ParseDevice("test"), kTest0);
  EXPECT_EQ(ParseDevice("test:1"), kTest1);
  EXPECT_EQ(kTest1.ToString(), "test:1");
  EXPECT_THROW(ParseDevice("test:"), Error);
  std::string why;
  EXPECT_TRUE(DeviceUsable(kTest1, &why)) << why;
  EXPECT_FALSE(DeviceUsable(Device{DeviceType::kTest, kTestDeviceCount}, &why));
  EXPECT_NE(why.find("test:0 to test:"), std::string::npos) << why;
}

TEST(TestDevice, CopiesThereAndBackBitwise) {
  for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32}) {
    Tensor host = Iota({3, 5, 7}, dtype);
    Tensor dev = host.To(kTest0);
    EXPECT_EQ(dev.device(), kTest0);
    Tensor other = dev.To(kTest1);  // between two test devices
    Tensor back = other.To(Device::CPU());
    EXPECT_TRUE(SameBytes(host, back)) << DTypeName(dtype);
    Tensor clone = dev.Clone();  // a copy on the device
    EXPECT_TRUE(SameBytes(host, clone.To(Device::CPU()))) << DTypeName(dtype);
  }
}

TEST(TestDevice, FillConvertAndReorderMatchTheCpu) {
  for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    Tensor host({4, 3}, dtype);
    host.Fill(1.0 / 3.0);
    Tensor dev({4, 3}, dtype, TestDeviceRuntime().DeviceAllocator(0));
    dev.Fill(1.0 / 3.0);
    EXPECT_TRUE(SameBytes(host, dev.To(Device::CPU()))) << DTypeName(dtype);

    Tensor src = Iota({4, 3}, DType::kF32);
    Tensor cpu_converted({4, 3}, dtype);
    cpu_converted.ConvertFrom(src);
    Tensor dev_converted({4, 3}, dtype, TestDeviceRuntime().DeviceAllocator(0));
    dev_converted.ConvertFrom(src.To(kTest0));
    EXPECT_TRUE(SameBytes(cpu_converted, dev_converted.To(Device::CPU()))) << DTypeName(dtype);
  }
  Tensor nchw = Iota({2, 3, 4, 5});
  Tensor cpu_nhwc = nchw.Reordered(MemoryFormat::kNHWC);
  Tensor dev_nhwc = nchw.To(kTest0).Reordered(MemoryFormat::kNHWC);
  EXPECT_EQ(dev_nhwc.format(), MemoryFormat::kNHWC);
  EXPECT_TRUE(SameBytes(cpu_nhwc, dev_nhwc.To(Device::CPU())));
}

TEST(TestDevice, HostAccessIsRefusedNamingTheTensorAndDevice) {
  Tensor dev = Iota({2, 2}).To(kTest1);
  dev.set_name("conv1.weight");
  EXPECT_EQ(ErrorOf([&] { dev.data<float>(); }),
            "tensor 'conv1.weight' f32[2, 2] is on test:1 and cannot be read or written by host "
            "code; copy it with To(cpu) first");
  EXPECT_NE(ErrorOf([&] { ElementAsDouble(dev, 0); }).find("on test:1"), std::string::npos);
  // The wrong type is still reported as such.
  EXPECT_NE(ErrorOf([&] { dev.data<double>(); }).find("accessed as f64"), std::string::npos);
  // device_data is the kernels' pointer: no refusal.
  EXPECT_EQ(static_cast<void*>(dev.device_data<float>()), dev.raw_data());
}

TEST(TestDevice, MemoryIsGuardedOutsideKernelsAndOpenInside) {
  Tensor dev = Iota({1000}).To(kTest0);
  EXPECT_TRUE(TestDeviceMemoryGuarded(dev.raw_data()));
  Tensor out({1000}, DType::kF32, TestDeviceRuntime().DeviceAllocator(0));
  bool was_open = false;
  LaunchOnTestDevice(kTest0, {dev, out},
                     [&was_open, x = dev.device_data<float>(), y = out.device_data<float>()] {
                       was_open = !TestDeviceMemoryGuarded(x) && !TestDeviceMemoryGuarded(y);
                       for (int i = 0; i < 1000; ++i) y[i] = 2 * x[i];
                     });
  Tensor back = out.To(Device::CPU());  // waits for the kernel
  EXPECT_TRUE(was_open);
  EXPECT_TRUE(TestDeviceMemoryGuarded(dev.raw_data()));
  EXPECT_TRUE(TestDeviceMemoryGuarded(out.raw_data()));
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(back.data<float>()[i], 2 * (0.25f * i - 3));
}

using TestDeviceDeathTest = ::testing::Test;

TEST_F(TestDeviceDeathTest, AHostReadOutsideAKernelFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor dev = Iota({16}).To(kTest0);
  const volatile float* p = static_cast<const float*>(dev.raw_data());
  EXPECT_EXIT({ [[maybe_unused]] float v = p[3]; }, ::testing::KilledBySignal(SIGSEGV), "");
}

TEST_F(TestDeviceDeathTest, AHostWriteOutsideAKernelFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor dev({16}, DType::kF32, TestDeviceRuntime().DeviceAllocator(0));
  volatile float* p = static_cast<float*>(dev.raw_data());
  EXPECT_EXIT({ p[0] = 1.0f; }, ::testing::KilledBySignal(SIGSEGV), "");
}

TEST_F(TestDeviceDeathTest, AKernelTouchingMemoryItWasNotGivenFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor given = Iota({16}).To(kTest0);
  Tensor not_given = Iota({16}).To(kTest0);
  EXPECT_EXIT(
      {
        LaunchOnTestDevice(kTest0, {given}, [p = not_given.device_data<float>()] { p[0] = 1; });
        TestDeviceRuntime().Synchronize(0);
      },
      ::testing::KilledBySignal(SIGSEGV), "");
}

TEST(TestDevice, AStreamRunsInOrderAndAKernelErrorSurfacesAtTheNextWait) {
  Tensor t({1}, DType::kI32, TestDeviceRuntime().DeviceAllocator(2));
  t.Zero();
  for (int i = 1; i <= 50; ++i) {
    LaunchOnTestDevice(t.device(), {t}, [p = t.device_data<int32_t>(), i] {
      if (p[0] != i - 1) Fail("out of order");
      p[0] = i;
    });
  }
  EXPECT_EQ(t.To(Device::CPU()).data<int32_t>()[0], 50);
  LaunchOnTestDevice(t.device(), {t}, [] { Fail("kernel failed on purpose"); });
  LaunchOnTestDevice(t.device(), {t}, [p = t.device_data<int32_t>()] { p[0] = -1; });  // skipped
  EXPECT_EQ(ErrorOf([&] { TestDeviceRuntime().Synchronize(2); }), "kernel failed on purpose");
  EXPECT_EQ(t.To(Device::CPU()).data<int32_t>()[0], 50);
}

TEST(TestDevice, ACopyFromPinnedMemoryHoldsItsBlockUntilTheStreamHasPassedIt) {
  DeviceRuntime& rt = TestDeviceRuntime();
  Tensor dev({256}, DType::kF32, rt.DeviceAllocator(3));
  const void* first = nullptr;
  {
    Tensor pinned({256}, DType::kF32, rt.PinnedHostAllocator());
    first = pinned.raw_data();
    pinned.Fill(7.0);
    // Keep the stream busy so the copy is still queued when the pinned tensor is freed.
    LaunchOnTestDevice(dev.device(), {dev},
                       [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
    Tensor staged = pinned;
    rt.Copy(dev, staged);
  }
  Tensor next({256}, DType::kF32, rt.PinnedHostAllocator());
  EXPECT_NE(next.raw_data(), first) << "a pinned block was handed out while a copy read it";
  next.Fill(-1.0);
  Tensor back = dev.To(Device::CPU());
  for (int i = 0; i < 256; ++i) ASSERT_EQ(back.data<float>()[i], 7.0f);
}

// A layer with CPU kernels only: on the test device it runs them inside a kernel, unless it says
// it may not, when device inputs are refused in both directions.
class Doubling : public Layer {
 public:
  using Layer::Layer;
  bool on_test_device = false;
  bool RunsCpuKernelOnTestDevice() const override { return on_test_device; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    top[0]->data.Resize(bottom[0]->data.shape(), bottom[0]->data.dtype());
  }

 protected:
  void ForwardF32(const Blobs& bottom, const Blobs& top) override {
    for (int64_t i = 0; i < bottom[0]->data.numel(); ++i) {
      top[0]->data.data<float>()[i] = 2 * bottom[0]->data.data<float>()[i];
    }
  }
  void BackwardF32(const Blobs& top, const std::vector<bool>&, const Blobs& bottom) override {
    for (int64_t i = 0; i < bottom[0]->grad.numel(); ++i) {
      bottom[0]->grad.data<float>()[i] = 2 * top[0]->grad.data<float>()[i];
    }
  }
};

TEST(TestDevice, LayerForwardAndBackwardRefuseADeviceWithoutKernels) {
  Doubling layer(LayerSpec{"double", "Doubling", {"x"}, {"y"}, {}, ""});
  Blob x{"x", Iota({4}), Iota({4})};
  Blob y{"y", Tensor({4}), Tensor({4})};
  layer.SetUp({&x}, {&y});
  layer.Forward({&x}, {&y});  // on the CPU it runs
  x.data = x.data.To(kTest0);
  x.grad = x.grad.To(kTest0);
  y.data = y.data.To(kTest0);
  y.grad = y.grad.To(kTest0);
  EXPECT_EQ(ErrorOf([&] { layer.Forward({&x}, {&y}); }),
            "layer 'double' (Doubling): input 'x' is on test:0, and this layer has no kernels for "
            "that device (only the CPU's)");
  EXPECT_EQ(ErrorOf([&] { layer.Backward({&y}, {true}, {&x}); }),
            "layer 'double' (Doubling): backward of input 'x' on test:0, and this layer has no "
            "kernels for that device (only the CPU's)");
  y.grad = y.grad.To(Device::CPU());
  EXPECT_EQ(ErrorOf([&] { layer.Backward({&y}, {true}, {&x}); }),
            "layer 'double' (Doubling): gradient of 'y' is on cpu, not on test:0 with its first "
            "input: a layer runs on one device");
}

}  // namespace
}  // namespace cortado

namespace cortado {
namespace {

TEST(TestDevice, ALayerRunsItsCpuKernelInsideATestDeviceKernel) {
  Doubling layer(LayerSpec{"double", "Doubling", {"x"}, {"y"}, {}, ""});
  layer.on_test_device = true;
  Blob x{"x", Iota({4}).To(kTest0), Iota({4}).To(kTest0)};
  Blob y{"y", Tensor({4}, DType::kF32, TestDeviceRuntime().DeviceAllocator(0)),
         Iota({4}).To(kTest0)};
  layer.SetUp({&x}, {&y});
  layer.Forward({&x}, {&y});
  layer.Backward({&y}, {true}, {&x});
  const Tensor out = y.data.To(Device::CPU()), dx = x.grad.To(Device::CPU());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(out.data<float>()[i], 2 * (0.25f * i - 3));
    EXPECT_EQ(dx.data<float>()[i], 2 * (0.25f * i - 3));
  }
  EXPECT_TRUE(TestDeviceMemoryGuarded(y.data.raw_data()));
}

}  // namespace
}  // namespace cortado
