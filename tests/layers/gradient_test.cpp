// Numerical gradient checks (central differences, f64) of every layer's input and parameter
// gradients on small random shapes, including the stride / pad / dilation / groups /
// ceil_mode variants, batch norm in both phases and label smoothing.
#include <gtest/gtest.h>

#include "engine/base/thread_pool.h"
#include "tests/layers/gradient_check.h"
#include "tests/layers/layer_harness.h"

namespace cortado::testing {
namespace {

constexpr DType kF64 = DType::kF64;

void ExpectGradientsOk(const std::string& type, const Settings& settings,
                       std::vector<Tensor> inputs, int num_tops = 1, Phase phase = Phase::kTrain,
                       const GradientCheckOptions& options = {}) {
  LayerHarness h(type, settings, std::move(inputs), num_tops, phase);
  GradientCheckReport report = CheckLayerGradients(h.layer(), h.bottom(), h.top(), options);
  EXPECT_TRUE(report.ok) << h.layer().Describe() << ": " << report.Summary();
  EXPECT_GT(report.checked, 0);
}

Settings Conv(int num_output, int kernel) {
  Settings s;
  s.Set("num_output", num_output).Set("kernel", kernel);
  return s;
}

TEST(GradientCheck, ConvolutionBasic) {
  ExpectGradientsOk("Convolution", Conv(4, 3).Set("pad", 1), {RandomTensor({2, 3, 5, 6}, kF64, 1)});
}

TEST(GradientCheck, ConvolutionStridePadNoBias) {
  ExpectGradientsOk("Convolution", Conv(3, 3).Set("stride", 2).Set("pad", 1).Set("bias", false),
                    {RandomTensor({2, 2, 7, 6}, kF64, 2)});
}

TEST(GradientCheck, ConvolutionDilation) {
  ExpectGradientsOk("Convolution", Conv(2, 3).Set("dilation", 2).Set("pad", 2),
                    {RandomTensor({2, 2, 7, 7}, kF64, 3)});
}

TEST(GradientCheck, ConvolutionGroups) {
  ExpectGradientsOk("Convolution", Conv(4, 3).Set("groups", 2).Set("pad", 1),
                    {RandomTensor({2, 4, 5, 5}, kF64, 4)});
}

TEST(GradientCheck, ConvolutionDepthwiseStride2) {
  ExpectGradientsOk("Convolution", Conv(3, 3).Set("groups", 3).Set("pad", 1).Set("stride", 2),
                    {RandomTensor({2, 3, 6, 6}, kF64, 5)});
}

TEST(GradientCheck, Convolution1x1) {
  ExpectGradientsOk("Convolution", Conv(3, 1), {RandomTensor({2, 4, 3, 4}, kF64, 6)});
}

TEST(GradientCheck, Convolution1x1Stride2) {
  ExpectGradientsOk("Convolution", Conv(3, 1).Set("stride", 2),
                    {RandomTensor({2, 3, 5, 5}, kF64, 7)});
}

TEST(GradientCheck, ConvolutionRectangular) {
  Settings s;
  s.Set("num_output", 2).SetInts("kernel", {3, 2}).SetInts("stride", {2, 1});
  s.SetInts("pad", {1, 0}).SetInts("dilation", {1, 2});
  ExpectGradientsOk("Convolution", s, {RandomTensor({2, 2, 6, 7}, kF64, 8)});
}

// Small outputs (3x3) batch several images per GEMM; 7 images over the pool's threads gives
// blocks of uneven sizes.
TEST(GradientCheck, ConvolutionBlockedImages) {
  ExpectGradientsOk("Convolution", Conv(3, 3).Set("pad", 1), {RandomTensor({7, 2, 3, 3}, kF64, 9)});
  ExpectGradientsOk("Convolution", Conv(3, 1).Set("bias", false),
                    {RandomTensor({5, 2, 2, 3}, kF64, 10)});
}

TEST(GradientCheck, ConvolutionKaimingNormalInit) {
  ExpectGradientsOk("Convolution", Conv(2, 3).Set("weight_init", "kaiming_normal"),
                    {RandomTensor({1, 2, 4, 4}, kF64, 11)});
}

TEST(GradientCheck, InnerProduct) {
  Settings s;
  s.Set("num_output", 4);
  ExpectGradientsOk("InnerProduct", s, {RandomTensor({3, 5}, kF64, 20)});
  Settings nb;
  nb.Set("num_output", 3).Set("bias", false);
  ExpectGradientsOk("InnerProduct", nb, {RandomTensor({2, 2, 2, 3}, kF64, 21)});
}

TEST(GradientCheck, BatchNormTrain) {
  ExpectGradientsOk("BatchNorm", Settings(), {RandomTensor({3, 4, 2, 3}, kF64, 30, 2.0)});
  ExpectGradientsOk("BatchNorm", Settings(), {RandomTensor({5, 3}, kF64, 31)});
  Settings no_affine;
  no_affine.Set("affine", false).Set("eps", 1e-3);
  ExpectGradientsOk("BatchNorm", no_affine, {RandomTensor({2, 3, 3, 2}, kF64, 32)});
}

// In the test phase (and with use_global_stats) BN is an affine map of its input using the
// running statistics; give them non-trivial values first.
TEST(GradientCheck, BatchNormGlobalStats) {
  for (int variant = 0; variant < 2; ++variant) {
    Settings s;
    Phase phase = Phase::kTest;
    if (variant == 1) {
      s.Set("use_global_stats", true);
      phase = Phase::kTrain;
    }
    LayerHarness h("BatchNorm", s, {RandomTensor({2, 3, 2, 2}, kF64, 33)}, 1, phase);
    for (int c = 0; c < 3; ++c) {
      h.layer().buffers()[0].value.data<double>()[c] = 0.1 * c - 0.1;
      h.layer().buffers()[1].value.data<double>()[c] = 0.5 + 0.4 * c;
      h.layer().params()[0].value.data<double>()[c] = 1.0 + 0.25 * c;
      h.layer().params()[1].value.data<double>()[c] = -0.2 * c;
    }
    GradientCheckReport report = CheckLayerGradients(h.layer(), h.bottom(), h.top());
    EXPECT_TRUE(report.ok) << report.Summary();
  }
}

TEST(GradientCheck, ReLU) {
  ExpectGradientsOk("ReLU", Settings(), {AwayFromZeroTensor({2, 3, 4}, kF64, 40)});
  Settings leaky;
  leaky.Set("negative_slope", 0.2);
  ExpectGradientsOk("ReLU", leaky, {AwayFromZeroTensor({3, 7}, kF64, 41)});
}

Settings Pool(const char* pool, int kernel, int stride, int pad) {
  Settings s;
  s.Set("pool", pool).Set("kernel", kernel).Set("stride", stride).Set("pad", pad);
  return s;
}

TEST(GradientCheck, PoolingMax) {
  ExpectGradientsOk("Pooling", Pool("max", 2, 2, 0), {DistinctTensor({2, 2, 4, 6}, kF64, 50)});
  ExpectGradientsOk("Pooling", Pool("max", 3, 2, 1).Set("ceil_mode", true),
                    {DistinctTensor({2, 2, 6, 6}, kF64, 51)});
  Settings rect;
  rect.Set("pool", "max").SetInts("kernel", {2, 3}).SetInts("stride", {1, 2});
  ExpectGradientsOk("Pooling", rect, {DistinctTensor({1, 2, 4, 7}, kF64, 52)});
}

TEST(GradientCheck, PoolingAverage) {
  ExpectGradientsOk("Pooling", Pool("ave", 3, 2, 1), {RandomTensor({2, 2, 5, 5}, kF64, 53)});
  ExpectGradientsOk("Pooling", Pool("ave", 3, 2, 1).Set("count_include_pad", false),
                    {RandomTensor({2, 2, 5, 5}, kF64, 54)});
  ExpectGradientsOk("Pooling", Pool("ave", 3, 2, 1).Set("ceil_mode", true),
                    {RandomTensor({1, 2, 6, 6}, kF64, 55)});
}

TEST(GradientCheck, PoolingGlobal) {
  Settings ave, max;
  ave.Set("pool", "ave").Set("global", true);
  max.Set("pool", "max").Set("global", true);
  ExpectGradientsOk("Pooling", ave, {RandomTensor({2, 3, 3, 4}, kF64, 56)});
  ExpectGradientsOk("Pooling", max, {DistinctTensor({2, 3, 3, 4}, kF64, 57)});
}

// Inputs cut from one tensor of distinct values, so that no two inputs tie anywhere.
std::vector<Tensor> DistinctInputs(int k, const Shape& shape, uint64_t seed) {
  Shape all = shape;
  all.insert(all.begin(), k);
  Tensor big = DistinctTensor(all, kF64, seed);
  std::vector<Tensor> out;
  const int64_t n = ShapeNumel(shape);
  for (int i = 0; i < k; ++i) {
    Tensor t(shape, kF64);
    std::copy(big.data<double>() + i * n, big.data<double>() + (i + 1) * n, t.data<double>());
    out.push_back(t);
  }
  return out;
}

TEST(GradientCheck, Eltwise) {
  Settings coeffs;
  coeffs.SetList("coeffs", {"0.5", "-1", "2"});
  ExpectGradientsOk("Eltwise", coeffs,
                    {RandomTensor({2, 3}, kF64, 60), RandomTensor({2, 3}, kF64, 61),
                     RandomTensor({2, 3}, kF64, 62)});
  Settings prod;
  prod.Set("operation", "prod");
  ExpectGradientsOk("Eltwise", prod,
                    {RandomTensor({2, 3}, kF64, 63), RandomTensor({2, 3}, kF64, 64),
                     RandomTensor({2, 3}, kF64, 65)});
  Settings max;
  max.Set("operation", "max");
  ExpectGradientsOk("Eltwise", max, DistinctInputs(3, {2, 4}, 66));
}

TEST(GradientCheck, Concat) {
  ExpectGradientsOk("Concat", Settings(),
                    {RandomTensor({2, 1, 2, 2}, kF64, 70), RandomTensor({2, 3, 2, 2}, kF64, 71)});
  Settings last;
  last.Set("axis", -1);
  ExpectGradientsOk("Concat", last,
                    {RandomTensor({2, 3}, kF64, 72), RandomTensor({2, 1}, kF64, 73),
                     RandomTensor({2, 2}, kF64, 74)});
}

TEST(GradientCheck, Flatten) {
  ExpectGradientsOk("Flatten", Settings(), {RandomTensor({2, 3, 2, 2}, kF64, 80)});
}

TEST(GradientCheck, DropoutTrainAndTest) {
  Settings s;
  s.Set("ratio", 0.4);
  ExpectGradientsOk("Dropout", s, {RandomTensor({4, 10}, kF64, 90)}, 1, Phase::kTrain);
  ExpectGradientsOk("Dropout", s, {RandomTensor({4, 10}, kF64, 91)}, 1, Phase::kTest);
}

TEST(GradientCheck, SoftmaxWithLoss) {
  ExpectGradientsOk("SoftmaxWithLoss", Settings(),
                    {RandomTensor({5, 4}, kF64, 100, 2.0), LabelTensor(5, 4, 101)});
  Settings smooth;
  smooth.Set("label_smoothing", 0.2);
  ExpectGradientsOk("SoftmaxWithLoss", smooth,
                    {RandomTensor({4, 6}, kF64, 102, 2.0), LabelTensor(4, 6, 103)});
}

TEST(GradientCheck, Split) {
  ExpectGradientsOk("Split", Settings(), {RandomTensor({2, 3, 2}, kF64, 110)}, 3);
}

}  // namespace
}  // namespace cortado::testing
