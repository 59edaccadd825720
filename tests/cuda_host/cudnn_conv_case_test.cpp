// The pure parts of the cuDNN convolution (engine/cuda/cudnn_conv.h) as table tests: output
// geometry, strides of NCHW and NHWC, the plan cache's key, the filter on engines' numerical
// notes, and the convolutions read from the model builders. No GPU and no cuDNN call.
#include <gtest/gtest.h>

#include <set>

#include "engine/cuda/cudnn_conv.h"
#include "tests/support/conv_geometries.h"
#include "tests/support/errors.h"
#include "tests/support/net_shapes.h"

namespace cortado::cuda {
namespace {

using cortado::testing::ErrorOf;

TEST(ConvGeometry, OutputSizeIsNnConv2ds) {
  struct Row {
    int64_t in, kernel, stride, pad, dilation, out;
  };
  const Row rows[] = {
      {224, 7, 2, 3, 1, 112},  // ResNet-50 conv1
      {56, 3, 2, 1, 1, 28},    // a strided 3x3
      {56, 1, 2, 0, 1, 28},    // a strided 1x1 projection
      {28, 5, 1, 2, 1, 28},    // LeNet, "same" padding
      {32, 3, 1, 1, 1, 32},   {7, 1, 1, 0, 1, 7},
      {8, 3, 3, 0, 1, 2},   // (8 - 3) / 3 + 1: the remainder is dropped
      {5, 3, 1, 0, 2, 1},   // dilation 2: the 3x3 kernel spans 5
      {4, 3, 1, 0, 2, 0},   // ... and no longer fits 4
      {1, 3, 1, 1, 1, 1},   // padding alone makes room
      {10, 3, 1, 2, 3, 8},  // span 7 on 14
  };
  for (const Row& r : rows) {
    EXPECT_EQ(ConvOutputSize(r.in, r.kernel, r.stride, r.pad, r.dilation), r.out)
        << "in " << r.in << " kernel " << r.kernel << " stride " << r.stride << " pad " << r.pad
        << " dilation " << r.dilation;
  }
}

TEST(ConvGeometry, ChecksNameTheGeometry) {
  ConvGeometry g{.n = 2, .c = 6, .h = 5, .w = 5, .k = 4, .kh = 3, .kw = 3, .groups = 4};
  EXPECT_NE(ErrorOf([&] { g.Check(); })
                .find("convolution N=2 C=6 H=5 W=5 -> K=4, kernel 3x3, stride 1x1, pad 0x0, "
                      "dilation 1x1, groups 4: groups must divide the input and output channels"),
            std::string::npos);
  g.groups = 2;
  EXPECT_EQ(ErrorOf([&] { g.Check(); }), "");
  g.kh = 7;
  EXPECT_NE(ErrorOf([&] { g.Check(); })
                .find("kernel 7x3, stride 1x1, pad 0x0, dilation 1x1, "
                      "groups 2: the kernel does not fit the padded input"),
            std::string::npos);
  g.kh = 3, g.stride_w = 0;
  EXPECT_NE(ErrorOf([&] { g.Check(); }).find("sizes must be positive"), std::string::npos);
}

TEST(ConvLayout, DenseStridesOfNchwAndNhwc) {
  EXPECT_EQ(DenseStrides({2, 3, 4, 5}, ConvFormat::kNCHW), (std::array<int64_t, 4>{60, 20, 5, 1}));
  // NHWC: channels fastest, then W, H, N; the dims stay (N, C, H, W).
  EXPECT_EQ(DenseStrides({2, 3, 4, 5}, ConvFormat::kNHWC), (std::array<int64_t, 4>{60, 1, 15, 3}));
  EXPECT_EQ(DenseStrides({1, 1, 1, 1}, ConvFormat::kNHWC), (std::array<int64_t, 4>{1, 1, 1, 1}));
  // Every element has exactly one offset in [0, count): the layout is dense.
  for (ConvFormat format : {ConvFormat::kNCHW, ConvFormat::kNHWC}) {
    const std::array<int64_t, 4> dims = {2, 3, 4, 5}, s = DenseStrides(dims, format);
    std::set<int64_t> offsets;
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t c = 0; c < 4; ++c)
          for (int64_t d = 0; d < 5; ++d) offsets.insert(a * s[0] + b * s[1] + c * s[2] + d * s[3]);
    EXPECT_EQ(offsets.size(), 120u);
    EXPECT_EQ(*offsets.begin(), 0);
    EXPECT_EQ(*offsets.rbegin(), 119);
  }
}

TEST(ConvLayout, TensorLayoutsOfAGroupedStridedNhwcConvolution) {
  ConvCase c;
  c.geometry = cortado::testing::StridedResNetConv();
  c.geometry.groups = 4;
  const std::array<ConvTensorLayout, 3> t = ConvTensorLayouts(c);
  EXPECT_EQ(t[0].dims, (std::array<int64_t, 4>{8, 64, 56, 56}));
  EXPECT_EQ(t[0].strides, (std::array<int64_t, 4>{200704, 1, 3584, 64}));
  EXPECT_EQ(t[1].dims, (std::array<int64_t, 4>{128, 16, 3, 3}));      // (K, C / groups, kh, kw)
  EXPECT_EQ(t[1].strides, (std::array<int64_t, 4>{144, 1, 48, 16}));  // OHWI
  EXPECT_EQ(t[2].dims, (std::array<int64_t, 4>{8, 128, 28, 28}));
  EXPECT_EQ(t[2].strides, (std::array<int64_t, 4>{100352, 1, 3584, 128}));
  c.format = c.filter_format = ConvFormat::kNCHW;
  const std::array<ConvTensorLayout, 3> n = ConvTensorLayouts(c);
  EXPECT_EQ(n[1].strides, (std::array<int64_t, 4>{144, 9, 3, 1}));  // OIHW
  EXPECT_EQ(n[2].strides, (std::array<int64_t, 4>{100352, 784, 28, 1}));
}

TEST(ConvKey, NamesEveryFieldOfTheCase) {
  ConvCase c;
  c.geometry = cortado::testing::StridedResNetConv();
  c.dtype = DType::kF16;
  EXPECT_EQ(ConvKey(c),
            "forward, NHWC (filter OHWI), f16, N=8 C=64 H=56 W=56 -> K=128, kernel 3x3, stride "
            "2x2, pad 1x1, dilation 1x1, groups 1, deterministic");
  c.dtype = DType::kF32, c.allow_tf32 = true, c.deterministic = false;
  c.pass = ConvPass::kBackwardFilter, c.format = ConvFormat::kNCHW;
  c.filter_format = ConvFormat::kNCHW;
  EXPECT_EQ(ConvKey(c),
            "backward filter, NCHW (filter OIHW), f32 (TF32 allowed), N=8 C=64 H=56 W=56 -> "
            "K=128, kernel 3x3, stride 2x2, pad 1x1, dilation 1x1, groups 1");

  // Every field changed alone gives another key.
  const ConvCase base = c;
  std::vector<ConvCase> variants;
  auto vary = [&](auto change) {
    ConvCase v = base;
    change(v);
    variants.push_back(v);
  };
  vary([](ConvCase& v) { v.geometry.n = 9; });
  vary([](ConvCase& v) { v.geometry.c = 32; });
  vary([](ConvCase& v) { v.geometry.h = 55; });
  vary([](ConvCase& v) { v.geometry.w = 55; });
  vary([](ConvCase& v) { v.geometry.k = 64; });
  vary([](ConvCase& v) { v.geometry.kh = 1; });
  vary([](ConvCase& v) { v.geometry.kw = 1; });
  vary([](ConvCase& v) { v.geometry.stride_h = 1; });
  vary([](ConvCase& v) { v.geometry.stride_w = 1; });
  vary([](ConvCase& v) { v.geometry.pad_h = 0; });
  vary([](ConvCase& v) { v.geometry.pad_w = 0; });
  vary([](ConvCase& v) { v.geometry.dilation_h = 2; });
  vary([](ConvCase& v) { v.geometry.dilation_w = 2; });
  vary([](ConvCase& v) { v.geometry.groups = 2; });
  vary([](ConvCase& v) { v.format = ConvFormat::kNHWC; });
  vary([](ConvCase& v) { v.filter_format = ConvFormat::kNHWC; });
  vary([](ConvCase& v) { v.dtype = DType::kBF16; });
  vary([](ConvCase& v) { v.allow_tf32 = false; });
  vary([](ConvCase& v) { v.deterministic = true; });
  vary([](ConvCase& v) { v.pass = ConvPass::kForward; });
  vary([](ConvCase& v) { v.pass = ConvPass::kBackwardData; });
  std::set<std::string> keys = {ConvKey(base)};
  for (const ConvCase& v : variants) keys.insert(ConvKey(v));
  EXPECT_EQ(keys.size(), variants.size() + 1);
}

TEST(ConvKey, Tf32MattersForF32Only) {
  ConvCase a, b;
  b.allow_tf32 = true;
  EXPECT_NE(ConvKey(a), ConvKey(b));
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    a.dtype = b.dtype = dtype;
    EXPECT_EQ(ConvKey(a), ConvKey(b)) << DTypeName(dtype);
  }
}

TEST(ConvEngineFilter, TakesOnlyWhatTheCaseAllows) {
  using Notes = std::vector<cudnnBackendNumericalNote_t>;
  const Notes none,
      tensor_core = {CUDNN_NUMERICAL_NOTE_TENSOR_CORE},
      down = {CUDNN_NUMERICAL_NOTE_TENSOR_CORE, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS},
      reduced = {CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION},
      nondet = {CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC},
      winograd = {CUDNN_NUMERICAL_NOTE_WINOGRAD, CUDNN_NUMERICAL_NOTE_FFT};
  struct Row {
    DType dtype;
    bool tf32, deterministic;
    const Notes* notes;
    const char* refusal;  // "" when taken
  };
  const Row rows[] = {
      {DType::kF32, false, true, &none, ""},
      {DType::kF32, false, true, &winograd, ""},
      {DType::kF32, false, true, &tensor_core, "tensor cores (TF32) where TF32 is not allowed"},
      {DType::kF32, true, true, &tensor_core, ""},
      {DType::kF16, false, true, &tensor_core, ""},
      {DType::kBF16, false, true, &tensor_core, ""},
      {DType::kF32, true, true, &down, "down-converts its inputs"},
      {DType::kF16, false, true, &down, "down-converts its inputs"},
      {DType::kF16, false, true, &reduced,
       "accumulates in reduced precision (f32 accumulation is asked)"},
      {DType::kF32, false, true, &nondet, "nondeterministic where determinism is asked"},
      {DType::kF32, false, false, &nondet, ""},
  };
  for (const Row& r : rows) {
    ConvCase c;
    c.dtype = r.dtype, c.allow_tf32 = r.tf32, c.deterministic = r.deterministic;
    EXPECT_EQ(ConvEngineFilter(c, *r.notes), r.refusal) << ConvKey(c);
  }
}

TEST(NetConvolutions, TheBuildersGiveEachNetsConvolutions) {
  std::map<std::string, std::vector<cortado::testing::NetConvolution>> by_net;
  for (const cortado::testing::TrainedNet& net : cortado::testing::TrainedNets()) {
    by_net[net.model] = cortado::testing::ConvolutionsOf(net);
  }
  // LeNet 2; ResNet-20 1 + 18 + 2 projections; ResNet-50 1 + 48 + 4 projections; VGG-16 13.
  EXPECT_EQ(by_net["lenet"].size(), 2u);
  EXPECT_EQ(by_net["resnet20"].size(), 21u);
  EXPECT_EQ(by_net["resnet50"].size(), 53u);
  EXPECT_EQ(by_net["vgg16"].size(), 13u);
  const ConvGeometry conv1 = by_net["resnet50"][0].geometry;
  EXPECT_EQ(conv1, (ConvGeometry{.n = 256,
                                 .c = 3,
                                 .h = 224,
                                 .w = 224,
                                 .k = 64,
                                 .kh = 7,
                                 .kw = 7,
                                 .stride_h = 2,
                                 .stride_w = 2,
                                 .pad_h = 3,
                                 .pad_w = 3}))
      << conv1.ToString();
  EXPECT_EQ(
      by_net["lenet"][1].geometry,
      (ConvGeometry{
          .n = 128, .c = 32, .h = 14, .w = 14, .k = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}))
      << by_net["lenet"][1].geometry.ToString();
  for (const auto& [net, convs] : by_net) {
    for (const cortado::testing::NetConvolution& conv : convs) {
      EXPECT_EQ(ErrorOf([&] { conv.geometry.Check(); }), "") << net << " " << conv.layer;
    }
  }
}

}  // namespace
}  // namespace cortado::cuda
