// Eltwise (sum with and without coefficients and the fused ReLU, product, max) and ReLU (slope 0
// and leaky) on the test device through their own bodies (layers/eltwise_kernels.h), against the
// CPU kernels, forward and every input gradient, in every floating dtype and both layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/layers/pool_copy_checks.h"

namespace cortado {
namespace {

using testing::pool_copy::ExpectDeviceEqualsCpu;
using testing::pool_copy::kFloatTypes;
using testing::pool_copy::LayerRun;
using testing::pool_copy::Name;
using testing::pool_copy::RunLayer;
using testing::pool_copy::Values;

const Device kTest0{DeviceType::kTest, 0};

std::vector<Tensor> Inputs(int count, DType dtype, MemoryFormat format, bool ties) {
  std::vector<Tensor> in;
  for (int j = 0; j < count; ++j) {
    in.push_back(Values({2, 3, 5, 4}, dtype, format, 10 + static_cast<uint64_t>(j), ties));
  }
  return in;
}

TEST(DeviceEltwise, SumsProductsAndMaximaAreTheCpusBitwise) {
  for (DType dtype : kFloatTypes) {
    for (MemoryFormat format : {MemoryFormat::kNCHW, MemoryFormat::kNHWC}) {
      const std::string name = Name(dtype, format);
      for (int count : {2, 3}) {
        Settings sum;
        ExpectDeviceEqualsCpu(kTest0, "Eltwise", sum, Inputs(count, dtype, format, false), 1,
                              name + " sum of " + std::to_string(count));
        Settings fused;
        fused.Set("relu", true);
        ExpectDeviceEqualsCpu(kTest0, "Eltwise", fused, Inputs(count, dtype, format, false), 1,
                              name + " sum + ReLU of " + std::to_string(count));
        Settings prod;
        prod.Set("operation", "prod");
        ExpectDeviceEqualsCpu(kTest0, "Eltwise", prod, Inputs(count, dtype, format, false), 1,
                              name + " product of " + std::to_string(count));
        Settings max;
        max.Set("operation", "max");  // values on a coarse grid: ties, the first input keeps them
        ExpectDeviceEqualsCpu(kTest0, "Eltwise", max, Inputs(count, dtype, format, true), 1,
                              name + " max of " + std::to_string(count));
      }
    }
  }
}

TEST(DeviceEltwise, ASumWithCoefficientsIsTheCpusWithinOneRounding) {
  // a x + b z may be contracted into a fused multiply-add on one side and not the other, so the
  // bound is one rounding of the result (16-bit: rounded once from f32 either way, within one
  // unit of the last place there).
  for (DType dtype : kFloatTypes) {
    Settings s;
    s.SetList("coeffs", {"0.5", "-2", "3"});
    s.Set("relu", true);
    const std::vector<Tensor> in = Inputs(3, dtype, MemoryFormat::kNCHW, false);
    const LayerRun cpu = RunLayer("Eltwise", s, in, 1, Device::CPU());
    const LayerRun dev = RunLayer("Eltwise", s, in, 1, kTest0);
    EXPECT_EQ(dev.fallbacks, 0);
    const double eps = dtype == DType::kF64    ? 0x1p-52
                       : dtype == DType::kF32  ? 0x1p-23
                       : dtype == DType::kBF16 ? 0x1p-7
                                               : 0x1p-10;
    for (size_t o = 0; o < cpu.outputs.size(); ++o) {
      for (int64_t i = 0; i < cpu.outputs[o].numel(); ++i) {
        const double a = ElementAsDouble(cpu.outputs[o], i), b = ElementAsDouble(dev.outputs[o], i);
        ASSERT_LE(std::abs(a - b), 2 * eps * (std::abs(a) + 8))
            << DTypeName(dtype) << " output " << o << " element " << i;
      }
    }
  }
}

TEST(DeviceEltwise, ReluInSixteenBitsRunsItsOwnBodyBitwise) {
  for (DType dtype : kFloatTypes) {
    for (double slope : {0.0, 0.1}) {
      Settings s;
      s.Set("negative_slope", slope);
      const std::vector<Tensor> in = {Values({2, 3, 5, 4}, dtype, MemoryFormat::kNHWC, 3, false)};
      ExpectDeviceEqualsCpu(kTest0, "ReLU", s, in, 1,
                            std::string(DTypeName(dtype)) + " slope " + std::to_string(slope));
    }
  }
}

}  // namespace
}  // namespace cortado
