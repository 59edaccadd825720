// Every layer in bf16 and f16 against its f64 reference: the same inputs (rounded to the low
// dtype), parameters and buffers, forward output and backward gradients (input and parameter)
// compared normwise: max |low - reference| / max |reference| within the dtype's tolerance.
// bf16 keeps 8 significant bits (unit roundoff 2^-9) and f16 11 (2^-12); inputs, outputs and
// gradients are rounded once each at storage while the arithmetic is f32, so the tolerances
// are a few units of the format's precision: 2^-5 for bf16 and 2^-8 for f16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/graph/gemm_lowp.h"
#include "layers/conv.h"
#include "tests/layers/layer_harness.h"

namespace cortado::testing {
namespace {

double Tolerance(DType dtype) { return dtype == DType::kBF16 ? 1.0 / 32 : 1.0 / 256; }

Tensor Converted(const Tensor& t, DType dtype) {
  Tensor out(t.shape(), dtype);
  out.ConvertFrom(t);
  return out;
}

// max |a - b| / max(max |b|, 1e-30), after converting a to f64.
double NormwiseError(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    worst = std::max(worst, std::abs(ElementAsDouble(a, i) - ElementAsDouble(b, i)));
    scale = std::max(scale, std::abs(ElementAsDouble(b, i)));
  }
  return worst / std::max(scale, 1e-30);
}

bool IsFloat(DType d) { return d == DType::kF64 || d == DType::kF32 || IsLowPrecision(d); }

// Runs `type` in f64 and in `dtype` on the same data and checks outputs and gradients.
void ExpectMatchesReference(DType dtype, const std::string& type, const Settings& settings,
                            const std::vector<Tensor>& inputs, int num_tops = 1,
                            Phase phase = Phase::kTrain, bool backward = true) {
  SCOPED_TRACE(type + " in " + DTypeName(dtype));
  // The reference sees the low-precision inputs widened back, so both start from equal values.
  std::vector<Tensor> ref_in, low_in;
  for (const Tensor& t : inputs) {
    if (!IsFloat(t.dtype())) {
      ref_in.push_back(t);
      low_in.push_back(t);
      continue;
    }
    Tensor low = Converted(t, dtype);
    ref_in.push_back(Converted(low, DType::kF64));
    low_in.push_back(low);
  }
  LayerHarness ref(type, settings, ref_in, num_tops, phase);
  LayerHarness low(type, settings, low_in, num_tops, phase);
  // Parameters and buffers are f32 in the low-precision layer (the master copy): give both the
  // reference's values (rounded to f32, then widened for the reference).
  ASSERT_EQ(ref.layer().params().size(), low.layer().params().size());
  for (size_t i = 0; i < low.layer().params().size(); ++i) {
    EXPECT_EQ(low.layer().params()[i].value.dtype(), DType::kF32) << "master weights are f32";
    low.layer().params()[i].value.ConvertFrom(ref.layer().params()[i].value);
    ref.layer().params()[i].value.ConvertFrom(low.layer().params()[i].value);
  }
  for (size_t i = 0; i < low.layer().buffers().size(); ++i) {
    EXPECT_EQ(low.layer().buffers()[i].value.dtype(), DType::kF32);
    low.layer().buffers()[i].value.ConvertFrom(ref.layer().buffers()[i].value);
    ref.layer().buffers()[i].value.ConvertFrom(low.layer().buffers()[i].value);
  }
  ref.Forward();
  low.Forward();
  const double tol = Tolerance(dtype);
  for (size_t j = 0; j < ref.top().size(); ++j) {
    const Tensor& out = low.top()[j]->data;
    // Losses, fractions, priors and detections stay f32 (boxes in 8 bits would move by pixels).
    const bool stat = type == "SoftmaxWithLoss" || type == "Accuracy" || type == "MultiBoxLoss" ||
                      type == "PriorBox" || type == "DetectionOutput";
    EXPECT_EQ(out.dtype(), stat ? DType::kF32 : dtype) << "output " << j;
    EXPECT_LE(NormwiseError(out, ref.top()[j]->data), tol) << "output " << j;
  }
  if (!backward) return;
  std::vector<Tensor> ref_grads, low_grads;
  for (size_t j = 0; j < ref.top().size(); ++j) {
    const Tensor& shape_of = ref.top()[j]->data;
    Tensor g = RandomTensor(shape_of.shape(), DType::kF64, 100 + j);
    Tensor g_low = Converted(g, low.top()[j]->data.dtype());
    ref_grads.push_back(Converted(g_low, DType::kF64));
    low_grads.push_back(g_low);
  }
  ref.Backward(ref_grads);
  low.Backward(low_grads);
  for (size_t i = 0; i < ref.bottom().size(); ++i) {
    if (!ref.layer().CanBackpropTo(static_cast<int>(i)) || !IsFloat(inputs[i].dtype())) continue;
    EXPECT_EQ(low.bottom()[i]->grad.dtype(), dtype);
    EXPECT_LE(NormwiseError(low.bottom()[i]->grad, ref.bottom()[i]->grad), tol) << "input " << i;
  }
  for (size_t i = 0; i < ref.layer().params().size(); ++i) {
    const Param& p = low.layer().params()[i];
    EXPECT_EQ(p.grad.dtype(), DType::kF32);
    EXPECT_LE(NormwiseError(p.grad, ref.layer().params()[i].grad), tol) << p.name;
  }
}

class MixedPrecision : public ::testing::TestWithParam<DType> {};

Tensor Labels(int64_t n, int64_t classes) {
  Tensor t({n}, DType::kI32);
  for (int64_t i = 0; i < n; ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % classes);
  return t;
}

TEST_P(MixedPrecision, Convolution) {
  Settings s;
  s.Set("num_output", 6).Set("kernel", 3).Set("pad", 1);
  ExpectMatchesReference(GetParam(), "Convolution", s,
                         {RandomTensor({2, 4, 7, 7}, DType::kF64, 1)});
  Settings strided = s;
  strided.Set("stride", 2).Set("groups", 2);
  ExpectMatchesReference(GetParam(), "Convolution", strided,
                         {RandomTensor({2, 4, 8, 8}, DType::kF64, 2)});
  // 1x1 over 23x23 = 529 positions: one image per GEMM, the input read as its own columns.
  Settings pointwise;
  pointwise.Set("num_output", 5).Set("kernel", 1).Set("bias", false);
  ExpectMatchesReference(GetParam(), "Convolution", pointwise,
                         {RandomTensor({2, 3, 23, 23}, DType::kF64, 4)});
}

// A stride-1 convolution run in bands of output rows (a column budget below one image's
// columns): 16-bit columns per band, the input gradient summed over the bands in f32.
TEST_P(MixedPrecision, ConvolutionInBands) {
  const int64_t saved = ConvolutionLayer::column_budget();
  ConvolutionLayer::SetColumnBudgetForTesting(2000);
  Settings s;
  s.Set("num_output", 5).Set("kernel", 3).Set("pad", 1);
  ExpectMatchesReference(GetParam(), "Convolution", s,
                         {RandomTensor({2, 3, 24, 23}, DType::kF64, 6)});
  ConvolutionLayer::SetColumnBudgetForTesting(saved);
}

// bf16 convolutions on the f32 fallback that CPUs without AVX512_BF16 run.
TEST(MixedPrecisionLayers, ConvolutionOnTheWidenedBF16Path) {
  const LowpGemmPath saved = BF16GemmPath();
  SetBF16GemmPath(LowpGemmPath::kWidened);
  Settings s;
  s.Set("num_output", 6).Set("kernel", 3).Set("pad", 1).Set("stride", 2);
  ExpectMatchesReference(DType::kBF16, "Convolution", s,
                         {RandomTensor({2, 4, 9, 9}, DType::kF64, 5)});
  SetBF16GemmPath(saved);
}

TEST_P(MixedPrecision, InnerProduct) {
  Settings s;
  s.Set("num_output", 5);
  ExpectMatchesReference(GetParam(), "InnerProduct", s,
                         {RandomTensor({3, 4, 2, 2}, DType::kF64, 3)});
}

TEST_P(MixedPrecision, Pooling) {
  Settings max;
  max.Set("pool", "max").Set("kernel", 2).Set("stride", 2);
  // Distinct values far apart (4 / 64 = 0.06, above bf16's step near 2) so that rounding
  // cannot make two candidates of a window tie.
  ExpectMatchesReference(GetParam(), "Pooling", max,
                         {DistinctTensor({2, 2, 4, 4}, DType::kF64, 4)});
  Settings ave;
  ave.Set("pool", "ave").Set("kernel", 3).Set("stride", 2).Set("pad", 1);
  ExpectMatchesReference(GetParam(), "Pooling", ave, {RandomTensor({2, 3, 7, 7}, DType::kF64, 5)});
  Settings global;
  global.Set("pool", "ave").Set("global", true);
  ExpectMatchesReference(GetParam(), "Pooling", global,
                         {RandomTensor({2, 3, 5, 5}, DType::kF64, 6)});
}

TEST_P(MixedPrecision, BatchNormTrainAndTest) {
  ExpectMatchesReference(GetParam(), "BatchNorm", Settings{},
                         {RandomTensor({4, 3, 5, 5}, DType::kF64, 7, 3.0)});
  ExpectMatchesReference(GetParam(), "BatchNorm", Settings{},
                         {RandomTensor({4, 3, 5, 5}, DType::kF64, 8)}, 1, Phase::kTest);
}

TEST_P(MixedPrecision, ReluAndDropout) {
  ExpectMatchesReference(GetParam(), "ReLU", Settings{},
                         {RandomTensor({2, 3, 4, 5}, DType::kF64, 9)});
  Settings leaky;
  leaky.Set("negative_slope", 0.1);
  ExpectMatchesReference(GetParam(), "ReLU", leaky, {RandomTensor({2, 3, 4, 5}, DType::kF64, 10)});
  Settings drop;
  drop.Set("ratio", 0.3);
  ExpectMatchesReference(GetParam(), "Dropout", drop, {RandomTensor({4, 50}, DType::kF64, 11)});
}

TEST_P(MixedPrecision, Eltwise) {
  const Shape shape{2, 3, 4, 4};
  Settings sum;
  sum.Set("operation", "sum").SetList("coeffs", {"1", "-0.5"});
  ExpectMatchesReference(
      GetParam(), "Eltwise", sum,
      {RandomTensor(shape, DType::kF64, 12), RandomTensor(shape, DType::kF64, 13)});
  Settings prod;
  prod.Set("operation", "prod");
  ExpectMatchesReference(
      GetParam(), "Eltwise", prod,
      {RandomTensor(shape, DType::kF64, 14), RandomTensor(shape, DType::kF64, 15)});
  Settings max;
  max.Set("operation", "max");
  ExpectMatchesReference(GetParam(), "Eltwise", max,
                         {DistinctTensor({2, 2, 2, 2}, DType::kF64, 16),
                          DistinctTensor({2, 2, 2, 2}, DType::kF64, 17)});
}

TEST_P(MixedPrecision, LossAndAccuracyStayF32) {
  Settings smooth;
  smooth.Set("label_smoothing", 0.1);
  ExpectMatchesReference(GetParam(), "SoftmaxWithLoss", smooth,
                         {RandomTensor({6, 5}, DType::kF64, 18, 2.0), Labels(6, 5)});
  Settings top2;
  top2.Set("top_k", 2);
  ExpectMatchesReference(GetParam(), "Accuracy", top2,
                         {DistinctTensor({6, 5}, DType::kF64, 19), Labels(6, 5)}, 1, Phase::kTrain,
                         /*backward=*/false);
}

TEST_P(MixedPrecision, DataMovers) {
  Settings concat;
  concat.Set("axis", 1);
  ExpectMatchesReference(
      GetParam(), "Concat", concat,
      {RandomTensor({2, 2, 3, 3}, DType::kF64, 20), RandomTensor({2, 3, 3, 3}, DType::kF64, 21)});
  ExpectMatchesReference(GetParam(), "Flatten", Settings{},
                         {RandomTensor({2, 3, 2, 2}, DType::kF64, 22)});
  ExpectMatchesReference(GetParam(), "Split", Settings{}, {RandomTensor({2, 5}, DType::kF64, 23)},
                         3);
}

// The detection layers: L2Norm and the loss compute in f32 (widened inputs, f32 weight and loss);
// Permute and Reshape move 16-bit values; PriorBox and DetectionOutput write f32 boxes.
TEST_P(MixedPrecision, DetectionLayers) {
  ExpectMatchesReference(GetParam(), "L2Norm", Settings{},
                         {RandomTensor({2, 5, 4, 3}, DType::kF64, 24)});
  Settings permute, reshape;
  permute.SetInts("order", {0, 2, 3, 1});
  reshape.SetInts("shape", {0, -1, 3});
  ExpectMatchesReference(GetParam(), "Permute", permute,
                         {RandomTensor({2, 6, 3, 2}, DType::kF64, 25)});
  ExpectMatchesReference(GetParam(), "Reshape", reshape,
                         {RandomTensor({2, 6, 3, 2}, DType::kF64, 26)});
  Settings priors;
  priors.SetInts("image_size", {32, 32});
  ExpectMatchesReference(GetParam(), "PriorBox", priors,
                         {Tensor({1, 1, 4, 4}, DType::kF64), Tensor({1, 1, 2, 2}, DType::kF64)}, 1,
                         Phase::kTrain, /*backward=*/false);
  // 4 x 4 x 4 + 2 x 2 x 4 = 80 priors of that layer, made here in f64.
  LayerHarness boxes("PriorBox", priors,
                     {Tensor({1, 1, 4, 4}, DType::kF64), Tensor({1, 1, 2, 2}, DType::kF64)});
  boxes.Forward();
  const Tensor prior_boxes = boxes.top()[0]->data.Clone();
  Tensor gt({1, 1, 2, 8}, DType::kF64);
  const double rows[16] = {0, 1, 0, 0.1, 0.1, 0.5, 0.6, 0, 1, 2, 0, 0.4, 0.3, 0.9, 0.8, 0};
  std::copy(rows, rows + 16, gt.data<double>());
  ExpectMatchesReference(GetParam(), "MultiBoxLoss", Settings{},
                         {RandomTensor({2, 80, 3}, DType::kF64, 27),
                          RandomTensor({2, 80, 4}, DType::kF64, 28), prior_boxes, gt});
  ExpectMatchesReference(GetParam(), "DetectionOutput", Settings{},
                         {RandomTensor({2, 80, 3}, DType::kF64, 29, 2.0),
                          RandomTensor({2, 80, 4}, DType::kF64, 30), prior_boxes},
                         1, Phase::kTest, /*backward=*/false);
}

// Layers whose 16-bit kernels run the f32 kernel on widened blocks (pooling, eltwise, the
// split's gradient sum) must equal f32 on the widened values, rounded once: bitwise.
void ExpectEqualsRoundedF32(DType dtype, const std::string& type, const Settings& settings,
                            const std::vector<Tensor>& inputs, int num_tops = 1) {
  SCOPED_TRACE(type + " in " + DTypeName(dtype));
  std::vector<Tensor> low_in, f32_in;
  for (const Tensor& t : inputs) {
    low_in.push_back(Converted(t, dtype));
    f32_in.push_back(Converted(low_in.back(), DType::kF32));
  }
  LayerHarness low(type, settings, low_in, num_tops);
  LayerHarness f32(type, settings, f32_in, num_tops);
  low.Forward();
  f32.Forward();
  for (size_t j = 0; j < low.top().size(); ++j) {
    const Tensor want = Converted(f32.top()[j]->data, dtype);
    ASSERT_EQ(low.top()[j]->data.nbytes(), want.nbytes());
    EXPECT_EQ(std::memcmp(low.top()[j]->data.raw_data(), want.raw_data(), want.nbytes()), 0)
        << "output " << j;
  }
  std::vector<Tensor> low_grads, f32_grads;
  for (size_t j = 0; j < low.top().size(); ++j) {
    low_grads.push_back(
        Converted(RandomTensor(low.top()[j]->data.shape(), DType::kF64, 40 + j), dtype));
    f32_grads.push_back(Converted(low_grads.back(), DType::kF32));
  }
  low.Backward(low_grads);
  f32.Backward(f32_grads);
  for (size_t i = 0; i < low.bottom().size(); ++i) {
    const Tensor want = Converted(f32.bottom()[i]->grad, dtype);
    EXPECT_EQ(std::memcmp(low.bottom()[i]->grad.raw_data(), want.raw_data(), want.nbytes()), 0)
        << "input gradient " << i;
  }
}

TEST_P(MixedPrecision, BlockwiseKernelsEqualRoundedF32) {
  Settings max;
  max.Set("pool", "max").Set("kernel", 3).Set("stride", 2).Set("pad", 1);
  ExpectEqualsRoundedF32(GetParam(), "Pooling", max, {RandomTensor({2, 3, 9, 9}, DType::kF64, 30)});
  Settings ave;
  ave.Set("pool", "ave").Set("kernel", 2).Set("stride", 2);
  ExpectEqualsRoundedF32(GetParam(), "Pooling", ave, {RandomTensor({2, 3, 8, 8}, DType::kF64, 31)});
  // Over 16384 elements, so the eltwise kernels run more than one block per thread.
  const Shape shape{3, 8, 30, 30};
  Settings sum;
  sum.Set("operation", "sum").SetList("coeffs", {"0.5", "-2", "1"});
  ExpectEqualsRoundedF32(
      GetParam(), "Eltwise", sum,
      {RandomTensor(shape, DType::kF64, 32), RandomTensor(shape, DType::kF64, 33),
       RandomTensor(shape, DType::kF64, 34)});
  Settings prod;
  prod.Set("operation", "prod");
  ExpectEqualsRoundedF32(
      GetParam(), "Eltwise", prod,
      {RandomTensor(shape, DType::kF64, 35), RandomTensor(shape, DType::kF64, 36),
       RandomTensor(shape, DType::kF64, 37)});
  ExpectEqualsRoundedF32(GetParam(), "Split", Settings{}, {RandomTensor(shape, DType::kF64, 38)},
                         3);
}

INSTANTIATE_TEST_SUITE_P(LowPrecision, MixedPrecision, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// The data movers keep their outputs in the input's storage in every dtype (no staging copy).
TEST(MixedPrecisionLayers, SplitAndFlattenShareStorageInBF16) {
  Tensor x = Converted(RandomTensor({2, 3, 2, 2}, DType::kF64, 24), DType::kBF16);
  LayerHarness split("Split", Settings{}, {x}, 2);
  split.Forward();
  EXPECT_TRUE(split.top()[0]->data.SharesStorageWith(x));
  EXPECT_TRUE(split.top()[1]->data.SharesStorageWith(x));
  LayerHarness flat("Flatten", Settings{}, {x});
  flat.Forward();
  EXPECT_TRUE(flat.top()[0]->data.SharesStorageWith(x));
}

TEST(MixedPrecisionLayers, AnUnsupportedDTypeNamesTheLayer) {
  Tensor labels({4}, DType::kI32);
  labels.Zero();
  LayerSpec spec;
  spec.name = "act";
  spec.type = "ReLU";
  auto layer = LayerRegistry::Create(spec);
  Blob in{"x", labels, {}}, out{"y", {}, {}};
  std::vector<Blob*> bottom{&in}, top{&out};
  try {
    layer->Forward(bottom, top);
    FAIL() << "an i32 input should not run";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("layer 'act' (ReLU): input 'x' is i32[4]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cortado::testing
