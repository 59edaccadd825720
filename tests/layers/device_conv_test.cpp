// The convolution and inner product layers' own device path on the guarded test device (the
// reference bodies in place of cuDNN and cuBLASLt) against the CPU layer, in f32, f64, bf16 and
// f16 (the CPU's mixed precision), within the bounds tests/layers/conv_checks.h states.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "layers/conv.h"
#include "tests/layers/conv_checks.h"

namespace cortado::testing::conv_device {
namespace {

const Device kTest0{DeviceType::kTest, 0};

TEST(DeviceConvolution, EveryPassWithinTheBoundOfTheCpu) {
  CheckConvolutionPasses(kTest0, {DType::kF32, DType::kF64}, 1);
}

TEST(DeviceInnerProduct, EveryProductWithinTheBoundOfTheCpu) {
  CheckInnerProducts(kTest0, {DType::kF32, DType::kF64}, 1);
}

TEST(DeviceConvolution, SixteenBitPassesWithinTheBoundOfTheCpu) {
  CheckConvolutionPasses(kTest0, {DType::kBF16, DType::kF16}, 1);
}

TEST(DeviceInnerProduct, SixteenBitProductsWithinTheBoundOfTheCpu) {
  CheckInnerProducts(kTest0, {DType::kBF16, DType::kF16}, 1);
}

TEST(DeviceConvolution, WithoutPropagateDownTheInputGradientIsLeftAlone) {
  CheckInputGradientLeftAlone(kTest0);
}

TEST(DeviceConvolution, TheLayerDescribesItsDeviceConvolution) {
  const Case c = ConvCases()[9];  // 3x3 stride 2 pad 2 dilation 2, groups 5, NHWC
  LayerSpec spec{"l", c.type, {"x"}, {"y"}, c.settings, ""};
  std::unique_ptr<Layer> layer = LayerRegistry::Create(spec);
  Blob bottom{"x", Values(c.input, DType::kF32, c.format, 1, false), Tensor()};
  Blob top{"y", Tensor({0}, DType::kF32), Tensor()};
  layer->SetUp({&bottom}, {&top});
  const ConvDims d = dynamic_cast<ConvolutionLayer&>(*layer).device_dims();
  EXPECT_EQ(top.data.shape(), (Shape{d.n, d.k, d.oh, d.ow}));
  EXPECT_EQ((std::vector<int64_t>{d.n, d.c, d.h, d.w, d.k, d.kh, d.kw, d.groups}),
            (std::vector<int64_t>{2, 10, 9, 8, 10, 3, 3, 5}));
  EXPECT_EQ(
      (std::vector<int64_t>{d.stride_h, d.stride_w, d.pad_h, d.pad_w, d.dilation_h, d.dilation_w}),
      (std::vector<int64_t>{2, 2, 2, 2, 2, 2}));
  EXPECT_TRUE(d.nhwc);
  EXPECT_TRUE(d.ohwi);  // channels-last activations read OHWI filters
}

}  // namespace
}  // namespace cortado::testing::conv_device
