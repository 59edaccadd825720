// The shared kernel bodies through their typed routes: the test device computes what the CPU
// route computes, bit for bit (both run the same body; the test device inside a guarded kernel),
// and the CPU route computes what the layers' and solver's reference arithmetic does.
#include "engine/tensor/device_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/tensor/indexed_launch.h"
#include "engine/tensor/test_device.h"

namespace cortado {
namespace {

const Device kTest0{DeviceType::kTest, 0};

Tensor Values(int64_t n, DType dtype, uint32_t seed) {
  Tensor t({n}, DType::kF64);
  uint32_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    t.data<double>()[i] = (static_cast<double>(s >> 8) / (1 << 24) - 0.5) * 4;
  }
  Tensor out({n}, dtype);
  out.ConvertFrom(t);
  return out;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

Tensor Host(const Tensor& t) { return t.To(Device::CPU()); }

class DeviceKernels : public ::testing::TestWithParam<DType> {};

TEST_P(DeviceKernels, ReluForwardAndBackwardMatchTheCpuBitwise) {
  const DType dt = GetParam();
  for (double slope : {0.0, 0.1}) {
    Tensor x = Values(1000, dt, 1), dy = Values(1000, dt, 2);
    Tensor y(x.shape(), dt), dx(x.shape(), dt);
    DeviceReluForward(x, y, slope);
    DeviceReluBackward(x, dy, dx, slope);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = ElementAsDouble(x, i);
      const double leaky =
          dt == DType::kF32 ? static_cast<double>(static_cast<float>(slope) * static_cast<float>(v))
                            : slope * v;
      ASSERT_EQ(ElementAsDouble(y, i), v > 0 ? v : leaky) << i;
    }
    Tensor xd = x.To(kTest0), dyd = dy.To(kTest0);
    Tensor yd = Tensor(x.shape(), dt).To(kTest0), dxd = Tensor(x.shape(), dt).To(kTest0);
    DeviceReluForward(xd, yd, slope);
    DeviceReluBackward(xd, dyd, dxd, slope);
    EXPECT_TRUE(SameBytes(y, Host(yd)));
    EXPECT_TRUE(SameBytes(dx, Host(dxd)));
  }
}

TEST_P(DeviceKernels, AxpyScaleAndSgdStepMatchTheCpuBitwise) {
  const DType dt = GetParam();
  Tensor x = Values(777, dt, 3), y = Values(777, dt, 4);
  Tensor xd = x.To(kTest0), yd = y.To(kTest0);
  DeviceAxpy(x, y, 0.5);
  DeviceAxpy(xd, yd, 0.5);
  EXPECT_TRUE(SameBytes(y, Host(yd)));
  DeviceScale(x, y, -3);
  DeviceScale(xd, yd, -3);
  EXPECT_TRUE(SameBytes(y, Host(yd)));

  for (bool nesterov : {false, true}) {
    Tensor w = Values(777, dt, 5), g = Values(777, dt, 6), v = Values(777, dt, 7);
    const Tensor w0 = w.Clone(), v0 = v.Clone();
    Tensor wd = w.To(kTest0), gd = g.To(kTest0), vd = v.To(kTest0);
    SgdStepArgs args{0.1, 5e-4, 0.9, 0.25, nesterov};
    for (int step = 0; step < 3; ++step) {
      DeviceSgdStep(w, g, v, args);
      DeviceSgdStep(wd, gd, vd, args);
    }
    EXPECT_TRUE(SameBytes(w, Host(wd)));
    EXPECT_TRUE(SameBytes(v, Host(vd)));
    // One step by hand in f64 (SgdSolver's formula), within the dtype's rounding.
    Tensor w1 = w0.Clone(), v1 = v0.Clone();
    DeviceSgdStep(w1, g, v1, args);
    for (int64_t i = 0; i < 777; i += 37) {
      const double d = ElementAsDouble(g, i) * 0.25 + 5e-4 * ElementAsDouble(w0, i);
      const double vi = 0.9 * ElementAsDouble(v0, i) + d;
      const double want = ElementAsDouble(w0, i) - 0.1 * (nesterov ? d + 0.9 * vi : vi);
      EXPECT_NEAR(ElementAsDouble(w1, i), want, dt == DType::kF32 ? 1e-5 : 1e-12);
    }
  }
}

TEST_P(DeviceKernels, TheFiniteCheckSetsOneFlagForEveryGradientOfAStep) {
  const DType dt = GetParam();
  Tensor a = Values(500, dt, 8), b = Values(300, dt, 9);
  Tensor flag({1}, DType::kI32);
  Tensor flag_d = Tensor({1}, DType::kI32).To(kTest0);
  flag_d.Zero();
  DeviceMarkNonFinite(a.To(kTest0), flag_d);
  DeviceMarkNonFinite(b.To(kTest0), flag_d);
  EXPECT_EQ(Host(flag_d).data<int32_t>()[0], 0);
  for (double bad :
       {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN()}) {
    Tensor c = b.Clone();
    Tensor one({1}, dt);
    one.Fill(bad);
    c.View({1}, 123).CopyFrom(one);
    flag_d.Zero();
    DeviceMarkNonFinite(a.To(kTest0), flag_d);
    DeviceMarkNonFinite(c.To(kTest0), flag_d);
    EXPECT_EQ(Host(flag_d).data<int32_t>()[0], 1) << bad;
    flag.Zero();
    DeviceMarkNonFinite(c, flag);
    EXPECT_EQ(flag.data<int32_t>()[0], 1) << bad;
  }
}

INSTANTIATE_TEST_SUITE_P(FloatTypes, DeviceKernels, ::testing::Values(DType::kF32, DType::kF64),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(DeviceKernelsRoute, MixedDevicesOrTypesAreRefusedNamingTheTensor) {
  Tensor x = Values(10, DType::kF32, 1);
  Tensor y = Tensor({10}, DType::kF32).To(kTest0);
  y.set_name("relu1");
  try {
    DeviceReluForward(x, y, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ReLU forward: 'relu1' f32[10] on test:0 with f32[10] on "
                                         "cpu"),
              std::string::npos)
        << e.what();
  }
  Tensor h = Values(10, DType::kF16, 1);
  EXPECT_THROW(DeviceReluForward(h, h, 0), Error);
}

// A body for RunIndexed: y[i] = x[n - 1 - i] * 2 (each index writes its own element).
struct ReverseTwice {
  const float* x = nullptr;
  float* y = nullptr;
  int64_t n = 0;
  CORTADO_HOST_DEVICE void operator()(int64_t i) const { y[i] = x[n - 1 - i] * 2.0f; }
};

TEST(RunIndexed, TheCpuAndTheTestDeviceRunTheBodyOverTheWholeRange) {
  const int64_t n = 10007;  // several chunks, the last one short
  Tensor x = Values(n, DType::kF32, 11);
  Tensor y({n}, DType::kF32);
  // RunIndexedOnHost: RunIndexed's CPU and test-device half (a test's body has no CUDA
  // instantiation, which RunIndexed would need in a CUDA build).
  ASSERT_TRUE(RunIndexedOnHost(Device::CPU(), {x, y}, n,
                               ReverseTwice{x.data<float>(), y.data<float>(), n}, 1000));
  for (int64_t i = 0; i < n; i += 13) ASSERT_EQ(y.data<float>()[i], 2 * x.data<float>()[n - 1 - i]);
  Tensor xd = x.To(kTest0), yd = Tensor({n}, DType::kF32).To(kTest0);
  ASSERT_TRUE(RunIndexedOnHost(
      kTest0, {xd, yd}, n,
      ReverseTwice{static_cast<const float*>(xd.raw_data()), static_cast<float*>(yd.raw_data()), n},
      1000));
  EXPECT_FALSE(RunIndexedOnHost(Device{DeviceType::kCUDA, 0}, {}, n, ReverseTwice{}));
  EXPECT_TRUE(SameBytes(y, Host(yd)));
  EXPECT_TRUE(TestDeviceMemoryGuarded(yd.raw_data()));  // closed again after the kernel
}

TEST(RunIndexed, TensorsOnTwoDevicesAreRefusedNamingBoth) {
  Tensor x = Values(10, DType::kF32, 1);
  Tensor y = Tensor({10}, DType::kF32).To(kTest0);
  y.set_name("pool1");
  try {
    DeviceOfLaunch("max pooling forward", {x, y});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max pooling forward: 'pool1' f32[10] is on test:0, not "
                                         "on cpu with f32[10]"),
              std::string::npos)
        << e.what();
  }
}

TEST(RunIndexed, TheCudaLaunchCoversEveryIndexOncePerThreadUpToItsGrid) {
  // One index per thread while the grid grows; past 65536 blocks the threads stride.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257},
                    int64_t{65536} * 256, int64_t{65536} * 256 + 1, int64_t{1} << 40}) {
    const LaunchGeometry g = IndexedLaunchGeometry(n);
    EXPECT_EQ(g.threads, 256) << n;
    EXPECT_GE(g.blocks, 1) << n;
    EXPECT_LE(g.blocks, 65536) << n;
    const int64_t per_pass = int64_t{g.blocks} * g.threads;
    if (n == 0) {
      EXPECT_EQ(g.blocks, 1);  // (LaunchIndexed launches nothing for n = 0)
    } else if (n <= int64_t{65536} * 256) {
      EXPECT_GE(per_pass, n) << n;        // every index in the first pass
      EXPECT_LT(per_pass - n, 256) << n;  // less than one block spare
    } else {
      EXPECT_EQ(g.blocks, 65536) << n;  // the grid-stride loop covers the rest
    }
  }
  EXPECT_EQ(IndexedLaunchGeometry(257).blocks, 2);
}

}  // namespace
}  // namespace cortado
