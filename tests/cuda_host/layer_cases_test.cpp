// What the convolution and inner product layers ask of cuDNN and cuBLASLt on a GPU
// (layers/cuda/layer_cases.h), checked on the host: the layer, set up for a geometry the cuDNN
// tests use, describes its convolution (ConvolutionLayer::device_dims) and the case made of it is
// that geometry in the layer's formats (OHWI filters with NHWC activations, OIHW with NCHW), f32
// without TF32, deterministic, in each pass; cuDNN finalizes its graph (checking the output size).
// The inner product's three products are the cases the cuBLASLt tests check.
#include "layers/cuda/layer_cases.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/graph/layer.h"
#include "layers/conv.h"
#include "tests/support/conv_geometries.h"
#include "tests/support/errors.h"

namespace cortado::cuda {
namespace {

using cortado::testing::ErrorOf;

// The convolution layer set up on the host for `g` with input in `format`: its device dims.
ConvDims LayerDims(const ConvGeometry& g, MemoryFormat format) {
  Settings s;
  s.Set("num_output", g.k)
      .SetInts("kernel", {g.kh, g.kw})
      .SetInts("stride", {g.stride_h, g.stride_w});
  s.SetInts("pad", {g.pad_h, g.pad_w}).SetInts("dilation", {g.dilation_h, g.dilation_w});
  s.Set("groups", g.groups).Set("bias", false);
  std::unique_ptr<Layer> layer =
      LayerRegistry::Create({"conv", "Convolution", {"x"}, {"y"}, s, ""});
  Blob x{"x", Tensor({g.n, g.c, g.h, g.w}, DType::kF32), Tensor()};
  x.data.set_format(format);
  Blob y{"y", Tensor({0}, DType::kF32), Tensor()};
  layer->SetUp({&x}, {&y});
  return dynamic_cast<ConvolutionLayer&>(*layer).device_dims();
}

TEST(LayerConvCase, TheLayersCaseIsTheGeometryInItsFormats) {
  std::vector<ConvGeometry> geometries = cortado::testing::UnusualConvolutions();
  geometries.push_back(cortado::testing::StridedResNetConv());
  for (const ConvGeometry& g : geometries) {
    for (MemoryFormat format : {MemoryFormat::kNHWC, MemoryFormat::kNCHW}) {
      const ConvDims d = LayerDims(g, format);
      EXPECT_EQ(d.oh, g.out_h()) << g.ToString();
      EXPECT_EQ(d.ow, g.out_w()) << g.ToString();
      for (ConvPassKind pass :
           {ConvPassKind::kForward, ConvPassKind::kBackwardData, ConvPassKind::kBackwardFilter}) {
        ConvCase want;
        want.geometry = g;
        want.format = want.filter_format =
            format == MemoryFormat::kNHWC ? ConvFormat::kNHWC : ConvFormat::kNCHW;
        want.dtype = DType::kF32;
        want.allow_tf32 = false;
        want.deterministic = true;
        want.pass = LayerConvPass(pass);
        const ConvCase got = LayerConvCase(d, pass, DType::kF32);
        EXPECT_EQ(got.geometry, want.geometry);
        EXPECT_EQ(ConvKey(got), ConvKey(want));  // every field of the case is in its key
        EXPECT_EQ(ErrorOf([&] { BuildConvGraph(got); }), "") << ConvKey(got);
      }
    }
  }
}

TEST(LayerConvCase, ThePassesAreCudnnsThree) {
  EXPECT_EQ(LayerConvPass(ConvPassKind::kForward), ConvPass::kForward);
  EXPECT_EQ(LayerConvPass(ConvPassKind::kBackwardData), ConvPass::kBackwardData);
  EXPECT_EQ(LayerConvPass(ConvPassKind::kBackwardFilter), ConvPass::kBackwardFilter);
}

void ExpectCase(const MatmulCase& got, const MatmulCase& want) {
  EXPECT_EQ(MatmulKey(got), MatmulKey(want));
  EXPECT_EQ(got.epilogue, want.epilogue) << MatmulKey(want);
  EXPECT_EQ(got.out_dtype, want.out_dtype) << MatmulKey(want);
  EXPECT_FALSE(got.allow_tf32) << MatmulKey(want);
  EXPECT_EQ(ErrorOf([&] { MatmulDescriptors descriptors(got); }), "") << MatmulKey(want);
}

TEST(LayerMatmulCase, TheInnerProductsProductsAreTheCublasLtTestsCases) {
  // ResNet-50's classifier: x (256 x 2048), W (1000 x 2048); as tests/cuda_host/
  // cublaslt_matmul_test.cpp's Forward, WeightGrad and InputGrad.
  for (bool bias : {true, false}) {
    ExpectCase(
        LayerMatmulCase(InnerProductForward(256, 2048, 1000, bias), DType::kF32, DType::kF32),
        {.m = 256,
         .n = 1000,
         .k = 2048,
         .transpose_b = true,
         .epilogue = bias ? MatmulEpilogue::kBias : MatmulEpilogue::kNone});
    ExpectCase(LayerMatmulCase(InnerProductWeightGradient(256, 2048, 1000, bias), DType::kF32,
                               DType::kF32),
               {.m = 1000,
                .n = 2048,
                .k = 256,
                .transpose_a = true,
                .epilogue = bias ? MatmulEpilogue::kBiasGradient : MatmulEpilogue::kNone});
  }
  ExpectCase(LayerMatmulCase(InnerProductInputGradient(256, 2048, 1000), DType::kF32, DType::kF32),
             {.m = 256, .n = 2048, .k = 1000});
}

TEST(LayerMatmulCase, SixteenBitActivationsKeepTheirWeightGradientInF32) {
  // bf16 and f16 activations (InnerProductLayer::MatmulOnDevice): 16-bit products, the forward
  // and the input gradient stored in 16 bits, the weight gradient and db in f32 (the CPU's
  // master dtype), all pairs cuBLASLt's descriptors accept.
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    ExpectCase(LayerMatmulCase(InnerProductForward(256, 2048, 1000, true), dtype, dtype),
               {.m = 256,
                .n = 1000,
                .k = 2048,
                .transpose_b = true,
                .dtype = dtype,
                .out_dtype = dtype,
                .epilogue = MatmulEpilogue::kBias});
    ExpectCase(
        LayerMatmulCase(InnerProductWeightGradient(256, 2048, 1000, true), dtype, DType::kF32),
        {.m = 1000,
         .n = 2048,
         .k = 256,
         .transpose_a = true,
         .dtype = dtype,
         .out_dtype = DType::kF32,
         .epilogue = MatmulEpilogue::kBiasGradient});
    ExpectCase(LayerMatmulCase(InnerProductInputGradient(256, 2048, 1000), dtype, dtype),
               {.m = 256, .n = 2048, .k = 1000, .dtype = dtype, .out_dtype = dtype});
  }
}

}  // namespace
}  // namespace cortado::cuda
