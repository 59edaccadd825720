// The convolution and inner product layers on a GPU (cuDNN and cuBLASLt through the layers' device
// path) against the CPU layer, in f32, within the bound of tests/layers/conv_checks.h (the checks
// the test device runs in test_layers), and f64 refused naming the layer. Labeled `cuda`; every
// test skips, saying why, where there is no usable GPU. Not yet run on a GPU.
#include <gtest/gtest.h>

#include <string>

#include "tests/layers/conv_checks.h"
#include "tests/support/errors.h"

namespace cortado::testing::conv_device {
namespace {

const Device kGpu{DeviceType::kCUDA, 0};

class ConvOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!DeviceUsable(kGpu, &why)) GTEST_SKIP() << why;
  }
};

TEST_F(ConvOnGpu, EveryPassWithinTheBoundOfTheCpu) {
  CheckConvolutionPasses(kGpu, {DType::kF32}, 8);
}
TEST_F(ConvOnGpu, EveryInnerProductWithinTheBoundOfTheCpu) {
  CheckInnerProducts(kGpu, {DType::kF32}, 8);
}
TEST_F(ConvOnGpu, WithoutPropagateDownTheInputGradientIsLeftAlone) {
  CheckInputGradientLeftAlone(kGpu);
}
TEST_F(ConvOnGpu, F64IsRefusedNamingTheLayer) {
  for (const Case& c : {ConvCases()[0], InnerProductCases()[0]}) {
    const std::string error = ErrorOf([&] { RunSteps(c, DType::kF64, kGpu, false); });
    EXPECT_NE(error.find("layer 'l' (" + c.type + "): f64 on cuda:0"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace cortado::testing::conv_device
