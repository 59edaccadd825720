// The detection layers (L2Norm, Permute, Reshape, PriorBox, MultiBoxLoss, DetectionOutput):
// numerical gradient checks of the trainable ones, ssd300_vgg16's priors against torchvision's
// (tests/testdata/torchvision/ssd300_priors.safetensors, written by
// tests/make_torchvision_golden.py), and the rules the goldens of tests/make_golden.py do not
// isolate: matching, hard negative mining, suppression, thresholds, the train phase, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/base/thread_pool.h"
#include "engine/io/safetensors.h"
#include "layers/multibox_loss.h"
#include "layers/prior_box.h"
#include "tests/layers/gradient_check.h"
#include "tests/layers/layer_harness.h"
#include "tests/support/errors.h"

namespace cortado::testing {
namespace {

constexpr DType kF32 = DType::kF32;
constexpr DType kF64 = DType::kF64;

using testing::ErrorOf;

void ExpectGradientsOk(const std::string& type, const Settings& settings,
                       std::vector<Tensor> inputs, const GradientCheckOptions& options = {}) {
  LayerHarness h(type, settings, std::move(inputs));
  GradientCheckReport report = CheckLayerGradients(h.layer(), h.bottom(), h.top(), options);
  EXPECT_TRUE(report.ok) << h.layer().Describe() << ": " << report.Summary();
  EXPECT_GT(report.checked, 0);
}

Tensor FromValues(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Tensor t(shape, dtype);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == kF32) {
      t.data<float>()[i] = static_cast<float>(values[i]);
    } else {
      t.data<double>()[i] = values[i];
    }
  }
  return t;
}

// Ground truth (1, 1, G, 8) from rows [item, label, instance, xmin, ymin, xmax, ymax, difficult].
Tensor GroundTruth(DType dtype, const std::vector<std::vector<double>>& rows) {
  std::vector<double> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return FromValues({1, 1, static_cast<int64_t>(rows.size()), 8}, dtype, flat);
}

// -------------------------------------------------------------------------------------------
// Gradient checks.

TEST(DetectionGradients, L2Norm) {
  Settings s;
  s.Set("scale_init", 3.0);
  ExpectGradientsOk("L2Norm", s, {RandomTensor({2, 5, 3, 4}, kF64, 1)});
  // Learned weights that differ per channel, and a 2-d input.
  LayerHarness h("L2Norm", Settings(), {RandomTensor({4, 6}, kF64, 2)});
  for (int c = 0; c < 6; ++c) h.layer().params()[0].value.data<double>()[c] = 0.5 + 0.7 * c;
  GradientCheckReport report = CheckLayerGradients(h.layer(), h.bottom(), h.top());
  EXPECT_TRUE(report.ok) << report.Summary();
}

// Many positions over several threads: the per-thread weight-gradient partials.
TEST(DetectionGradients, L2NormAcrossThreads) {
  const int saved = NumThreads();
  SetNumThreads(3);
  GradientCheckOptions options;
  options.rel_tol = 1e-5;  // 1089 positions (two tasks): the objective sums many terms
  ExpectGradientsOk("L2Norm", Settings(), {RandomTensor({1, 2, 33, 33}, kF64, 3)}, options);
  SetNumThreads(saved);
}

TEST(DetectionGradients, PermuteAndReshape) {
  Settings nhwc;
  nhwc.SetInts("order", {0, 2, 3, 1});
  ExpectGradientsOk("Permute", nhwc, {RandomTensor({2, 3, 4, 5}, kF64, 4)});
  Settings any;
  any.SetInts("order", {2, 0, 1});
  ExpectGradientsOk("Permute", any, {RandomTensor({3, 4, 5}, kF64, 5)});
  Settings reshape;
  reshape.SetInts("shape", {0, -1, 3});
  ExpectGradientsOk("Reshape", reshape, {RandomTensor({2, 6, 2, 2}, kF64, 6)});
}

// Priors of a small two-map detector (4x4 with ratios [2], 2x2 with [2, 3]): 88 boxes.
Tensor SmallPriors(DType dtype) {
  Settings s;
  s.SetInts("aspect_ratios", {2, 2, 3}).SetInts("aspect_ratios_per_map", {1, 2});
  s.SetInts("image_size", {32, 32});
  LayerHarness h("PriorBox", s, {Tensor({1, 1, 4, 4}, dtype), Tensor({1, 1, 2, 2}, dtype)});
  h.Forward();
  return h.top()[0]->data.Clone();
}

// Predictions away from the loss's kinks: |regression - target| not near 1 (smooth L1), and no
// two negatives' cross-entropies close enough that a step of 1e-5 reorders the mined set.
TEST(DetectionGradients, MultiBoxLoss) {
  const Tensor priors = SmallPriors(kF64);
  const int64_t p_n = priors.dim(0);
  const Tensor gt = GroundTruth(kF64, {{0, 1, 0, 0.10, 0.15, 0.55, 0.60, 0},
                                       {0, 3, 1, 0.50, 0.40, 0.90, 0.95, 0},
                                       {1, 2, 0, 0.30, 0.20, 0.70, 0.50, 1},
                                       {-1, -1, -1, -1, -1, -1, -1, -1}});
  Tensor logits = RandomTensor({3, p_n, 4}, kF64, 7, 1.5);
  Tensor regression = RandomTensor({3, p_n, 4}, kF64, 8, 0.7);
  // Targets of the matched priors, so the differences can be kept away from +-1.
  Settings s;
  LayerHarness h("MultiBoxLoss", s, {logits, regression, priors, gt});
  h.Forward();
  ASSERT_GT(static_cast<MultiBoxLossLayer&>(h.layer()).num_matched(), 2);
  h.Backward({FromValues({}, kF64, {1.0})});
  const double* dloc = h.bottom()[1]->grad.data<double>();
  const double m = static_cast<double>(static_cast<MultiBoxLossLayer&>(h.layer()).num_matched());
  for (int64_t i = 0; i < regression.numel(); ++i) {
    // |gradient| * M is min(|d|, 1): nudge the regression where |d| is within 0.05 of 1.
    const double g = std::fabs(dloc[i]) * m;
    if (g > 0.95 && g < 1.0) regression.data<double>()[i] += dloc[i] > 0 ? -0.1 : 0.1;
  }
  GradientCheckOptions options;
  options.rel_tol = 1e-6;
  GradientCheckReport report = CheckLayerGradients(h.layer(), h.bottom(), h.top(), options);
  EXPECT_TRUE(report.ok) << report.Summary();
  EXPECT_EQ(report.checked, logits.numel() + regression.numel());
}

// -------------------------------------------------------------------------------------------
// PriorBox.

// torchvision's ssd300_vgg16 at 300x300: feature maps 38, 19, 10, 5, 3, 1 give its 8732 default
// boxes, equal in f32 bit for bit.
TEST(PriorBox, Ssd300EqualsTorchvisionsBoxesExactly) {
  const Safetensors file =
      LoadSafetensors(std::string(CORTADO_TESTDATA_DIR) + "/torchvision/ssd300_priors.safetensors");
  const Tensor want = file.Find("priors")->ToTensor();
  ASSERT_EQ(want.shape(), (Shape{8732, 4}));
  Settings s;
  s.SetInts("aspect_ratios", {2, 2, 3, 2, 3, 2, 3, 2, 2});
  s.SetInts("aspect_ratios_per_map", {1, 2, 2, 2, 1, 1});
  s.SetList("scales", {"0.07", "0.15", "0.33", "0.51", "0.69", "0.87", "1.05"});
  s.SetInts("steps", {8, 16, 32, 64, 100, 300});
  std::vector<Tensor> inputs;
  for (int64_t side : {38, 19, 10, 5, 3, 1}) inputs.push_back(Tensor({1, 1, side, side}, kF32));
  inputs.push_back(Tensor({1, 3, 300, 300}, kF32));
  LayerHarness h("PriorBox", s, inputs);
  h.Forward();
  const Tensor& got = h.top()[0]->data;
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), kF32);
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(got.data<float>() + i, want.data<float>() + i, sizeof(float)) != 0) {
      if (first < 0) first = i;
      ++differ;
    }
  }
  EXPECT_EQ(differ, 0) << "first at element " << first << ": got " << got.data<float>()[first]
                       << ", torchvision " << want.data<float>()[first];
  EXPECT_EQ(static_cast<PriorBoxLayer&>(h.layer()).BoxesPerPosition(),
            (std::vector<int64_t>{4, 6, 6, 6, 4, 4}));
}

// Caffe SSD300's conv4_3 priors by hand: 38x38, step 8, min 30, max 60, ratios [2] with flip,
// offset 0.5, the first position's center (4, 4) on a 300x300 image; clip clamps the corners.
TEST(PriorBox, CaffeConventionByHand) {
  Settings s;
  s.Set("convention", "caffe").Set("min_sizes", 30).Set("max_sizes", 60).Set("aspect_ratios", 2);
  s.Set("steps", 8).Set("image_size", 300);
  LayerHarness h("PriorBox", s, {Tensor({1, 1, 38, 38}, kF64)});
  h.Forward();
  const double* p = h.top()[0]->data.data<double>();
  ASSERT_EQ(h.top()[0]->data.shape(), (Shape{38 * 38 * 4, 4}));
  const double c = 4.0 / 300;
  const double expect[4][4] = {{c, c, 30.0 / 300, 30.0 / 300},
                               {c, c, std::sqrt(1800.0) / 300, std::sqrt(1800.0) / 300},
                               {c, c, 30 * std::sqrt(2.0) / 300, 30 / std::sqrt(2.0) / 300},
                               {c, c, 30 / std::sqrt(2.0) / 300, 30 * std::sqrt(2.0) / 300}};
  for (int b = 0; b < 4; ++b) {
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(p[4 * b + k], expect[b][k], 1e-15) << b << "," << k;
  }
  // The second row of positions starts at center y = 12 / 300.
  EXPECT_NEAR(p[38 * 4 * 4 + 1], 12.0 / 300, 1e-15);
  // Clipped: [4 - 15, 4 + 15] / 300 becomes [0, 19 / 300], centered at 9.5 / 300.
  s.Set("clip", true);
  LayerHarness clipped("PriorBox", s, {Tensor({1, 1, 38, 38}, kF64)});
  clipped.Forward();
  const double* q = clipped.top()[0]->data.data<double>();
  EXPECT_NEAR(q[0], 9.5 / 300, 1e-15);
  EXPECT_NEAR(q[2], 19.0 / 300, 1e-15);
}

// The optional second output holds the variances; fed to the loss and the detections as an
// input they act as the same `variance` setting would.
TEST(PriorBox, VariancesOutputActsAsTheVarianceSetting) {
  Settings s;
  s.SetInts("aspect_ratios", {2, 2, 3}).SetInts("aspect_ratios_per_map", {1, 2});
  s.SetInts("image_size", {32, 32}).SetList("variance", {"0.2", "0.2", "0.4", "0.4"});
  LayerHarness h("PriorBox", s, {Tensor({1, 1, 4, 4}, kF64), Tensor({1, 1, 2, 2}, kF64)}, 2);
  h.Forward();
  const Tensor priors = h.top()[0]->data.Clone();
  const Tensor variances = h.top()[1]->data.Clone();
  ASSERT_EQ(variances.shape(), (Shape{88, 4}));
  for (int64_t p = 0; p < 88; ++p) {
    for (int k = 0; k < 4; ++k) {
      ASSERT_EQ(variances.data<double>()[4 * p + k], k < 2 ? 0.2 : 0.4);
    }
  }
  const Tensor gt =
      GroundTruth(kF64, {{0, 1, 0, 0.1, 0.1, 0.5, 0.6, 0}, {1, 2, 0, 0.3, 0.2, 0.9, 0.7, 0}});
  const Tensor logits = RandomTensor({2, 88, 3}, kF64, 1);
  const Tensor regression = RandomTensor({2, 88, 4}, kF64, 2);
  Settings wide;
  wide.SetList("variance", {"0.2", "0.2", "0.4", "0.4"});
  LayerHarness by_input("MultiBoxLoss", Settings(), {logits, regression, priors, gt, variances});
  LayerHarness by_setting("MultiBoxLoss", wide, {logits, regression, priors, gt});
  LayerHarness by_default("MultiBoxLoss", Settings(), {logits, regression, priors, gt});
  by_input.Forward();
  by_setting.Forward();
  by_default.Forward();
  const double loss = ElementAsDouble(by_input.top()[0]->data, 0);
  EXPECT_EQ(loss, ElementAsDouble(by_setting.top()[0]->data, 0));
  EXPECT_NE(loss, ElementAsDouble(by_default.top()[0]->data, 0));
  LayerHarness dets_input("DetectionOutput", Settings(), {logits, regression, priors, variances}, 1,
                          Phase::kTest);
  LayerHarness dets_setting("DetectionOutput", wide, {logits, regression, priors}, 1, Phase::kTest);
  dets_input.Forward();
  dets_setting.Forward();
  const Tensor& a = dets_input.top()[0]->data;
  const Tensor& b = dets_setting.top()[0]->data;
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_GT(a.dim(2), 0);
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
}

TEST(PriorBox, SettingsErrorsNameTheKey) {
  const std::vector<Tensor> maps = {Tensor({1, 1, 4, 4}, kF32), Tensor({1, 1, 2, 2}, kF32)};
  Settings counts;
  counts.SetInts("aspect_ratios", {2, 3}).SetInts("aspect_ratios_per_map", {1, 2});
  counts.Set("image_size", 32);
  EXPECT_NE(ErrorOf([&] { LayerHarness h("PriorBox", counts, maps); })
                .find("aspect_ratios_per_map' needs one count per feature map (2) adding up to "
                      "the 2 aspect_ratios"),
            std::string::npos);
  Settings scales;
  scales.SetList("scales", {"0.1", "0.2"}).Set("image_size", 32);
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h("PriorBox", scales, maps);
            }).find("key 'scales' needs 3 value(s) for 2 feature map(s), got 2"),
            std::string::npos);
  Settings caffe;
  caffe.Set("convention", "caffe").Set("image_size", 32);
  EXPECT_NE(ErrorOf([&] { LayerHarness h("PriorBox", caffe, maps); }).find("'min_sizes'"),
            std::string::npos);
  Settings bad;
  bad.Set("convention", "ssd");
  EXPECT_NE(ErrorOf([&] {
              LayerHarness h("PriorBox", bad, maps);
            }).find("expects torchvision or caffe, got 'ssd'"),
            std::string::npos);
}

// -------------------------------------------------------------------------------------------
// MultiBoxLoss.

// Two priors and one box equal to the first: it is the only positive, the second prior the one
// negative there is; zero logits give log(C) each.
TEST(MultiBoxLoss, KnownValue) {
  for (DType dtype : {kF32, kF64}) {
    const Tensor priors = FromValues({2, 4}, dtype, {0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 0.5, 0.5});
    const Tensor gt = GroundTruth(dtype, {{0, 2, 0, 0.0, 0.0, 0.5, 0.5, 0}});
    Tensor logits({1, 2, 3}, dtype);
    logits.Zero();
    const Tensor regression =
        FromValues({1, 2, 4}, dtype, {0.5, -2.0, 0.0, 0.0, 9.0, 9.0, 9.0, 9.0});
    LayerHarness h("MultiBoxLoss", Settings(), {logits, regression, priors, gt});
    h.Forward();
    // Smooth L1 of (0.5, -2, 0, 0) against the zero target: 0.125 + 1.5; two cross-entropies of
    // log 3; one positive.
    EXPECT_NEAR(ElementAsDouble(h.top()[0]->data, 0), 1.625 + 2 * std::log(3.0), 1e-6);
    h.Backward({FromValues({}, dtype, {1.0})});
    const Tensor& dloc = h.bottom()[1]->grad;
    EXPECT_NEAR(ElementAsDouble(dloc, 0), 0.5, 1e-7);
    EXPECT_NEAR(ElementAsDouble(dloc, 1), -1.0, 1e-7);
    for (int k = 4; k < 8; ++k) EXPECT_EQ(ElementAsDouble(dloc, k), 0.0);  // the negative
    const Tensor& dlogits = h.bottom()[0]->grad;
    EXPECT_NEAR(ElementAsDouble(dlogits, 2), 1.0 / 3 - 1, 1e-7);  // positive, class 2
    EXPECT_NEAR(ElementAsDouble(dlogits, 3), 1.0 / 3 - 1, 1e-7);  // negative, class 0
    EXPECT_NEAR(ElementAsDouble(dlogits, 4), 1.0 / 3, 1e-7);
  }
}

// A box whose best IoU is below the threshold still gets its best prior; priors at >= 0.5 IoU
// with a box are positives too.
TEST(MultiBoxLoss, MatchingTakesEachBoxsBestPriorAndPriorsAboveTheThreshold) {
  // Prior 0 equals the box (IoU 1); prior 1 overlaps it at exactly 0.5; prior 2 barely (the
  // small box's best prior); prior 3 nothing.
  const Tensor priors = FromValues(
      {4, 4}, kF64,
      {0.25, 0.25, 0.5, 0.5, 0.25, 0.375, 0.5, 0.25, 0.9, 0.9, 0.2, 0.2, 0.5, 0.9, 0.1, 0.1});
  const Tensor gt =
      GroundTruth(kF64, {{0, 1, 0, 0.0, 0.0, 0.5, 0.5, 0}, {0, 2, 1, 0.78, 0.78, 0.82, 0.82, 0}});
  Tensor logits({1, 4, 3}, kF64);
  logits.Zero();
  Tensor regression({1, 4, 4}, kF64);
  regression.Zero();
  LayerHarness h("MultiBoxLoss", Settings(), {logits, regression, priors, gt});
  h.Forward();
  EXPECT_EQ(static_cast<MultiBoxLossLayer&>(h.layer()).num_matched(), 3);
  h.Backward({FromValues({}, kF64, {1.0})});
  // The positives' class-target entries are negative: priors 0 and 1 for class 1, 2 for 2.
  const double* d = h.bottom()[0]->grad.data<double>();
  EXPECT_LT(d[0 * 3 + 1], 0);
  EXPECT_LT(d[1 * 3 + 1], 0);
  EXPECT_LT(d[2 * 3 + 2], 0);
  // Prior 3 is the one negative, mined (3 x 3 wanted, 1 there).
  EXPECT_LT(d[3 * 3 + 0], 0);
  // A threshold above 0.5 leaves prior 1 out.
  Settings strict;
  strict.Set("overlap_threshold", 0.6);
  LayerHarness s("MultiBoxLoss", strict, {logits, regression, priors, gt});
  s.Forward();
  EXPECT_EQ(static_cast<MultiBoxLossLayer&>(s.layer()).num_matched(), 2);
}

// With many negatives, exactly 3 per positive get a gradient: those with the largest
// cross-entropy.
TEST(MultiBoxLoss, MinesThreeHardestNegativesPerPositive) {
  const Tensor priors = SmallPriors(kF64);
  const int64_t p_n = priors.dim(0);
  const Tensor gt = GroundTruth(kF64, {{0, 1, 0, 0.0, 0.0, 0.2, 0.2, 0}});
  Tensor logits = RandomTensor({1, p_n, 2}, kF64, 11);
  Tensor regression({1, p_n, 4}, kF64);
  regression.Zero();
  LayerHarness h("MultiBoxLoss", Settings(), {logits, regression, priors, gt});
  h.Forward();
  const int64_t pos = static_cast<MultiBoxLossLayer&>(h.layer()).num_matched();
  ASSERT_GE(pos, 1);
  h.Backward({FromValues({}, kF64, {1.0})});
  const double* d = h.bottom()[0]->grad.data<double>();
  const double* dloc = h.bottom()[1]->grad.data<double>();
  // Cross-entropy against the background of each negative: log(1 + exp(x1 - x0)).
  std::vector<std::pair<double, int64_t>> negatives;
  int64_t mined = 0;
  for (int64_t p = 0; p < p_n; ++p) {
    const bool positive = dloc[4 * p] != 0 || dloc[4 * p + 1] != 0;
    if (positive) continue;
    const double* x = logits.data<double>() + 2 * p;
    negatives.push_back({std::log1p(std::exp(x[1] - x[0])), p});
    mined += d[2 * p] != 0 ? 1 : 0;
  }
  EXPECT_EQ(mined, 3 * pos);
  std::sort(negatives.rbegin(), negatives.rend());
  for (int64_t j = 0; j < static_cast<int64_t>(negatives.size()); ++j) {
    const bool kept = d[2 * negatives[j].second] != 0;
    EXPECT_EQ(kept, j < 3 * pos) << "negative of rank " << j;
  }
}

// A batch without boxes (G = 0, or Caffe's row of -1s) has no loss and no gradient.
TEST(MultiBoxLoss, NoBoxesNoLoss) {
  const Tensor priors = SmallPriors(kF32);
  const int64_t p_n = priors.dim(0);
  for (const Tensor& gt :
       {Tensor({1, 1, 0, 8}, kF32), GroundTruth(kF32, {std::vector<double>(8, -1)})}) {
    LayerHarness h(
        "MultiBoxLoss", Settings(),
        {RandomTensor({2, p_n, 3}, kF32, 1), RandomTensor({2, p_n, 4}, kF32, 2), priors, gt});
    h.Forward();
    EXPECT_EQ(ElementAsDouble(h.top()[0]->data, 0), 0.0);
    h.Backward({FromValues({}, kF32, {1.0})});
    for (int64_t i = 0; i < h.bottom()[0]->grad.numel(); ++i) {
      ASSERT_EQ(ElementAsDouble(h.bottom()[0]->grad, i), 0.0);
    }
  }
}

// Difficult boxes train by default (Caffe SSD's use_difficult_gt); false leaves them out.
TEST(MultiBoxLoss, DifficultBoxesFollowUseDifficultGt) {
  const Tensor priors = SmallPriors(kF64);
  const int64_t p_n = priors.dim(0);
  const Tensor gt = GroundTruth(kF64, {{0, 1, 0, 0.1, 0.1, 0.6, 0.6, 1}});
  const std::vector<Tensor> in = {RandomTensor({1, p_n, 2}, kF64, 3),
                                  RandomTensor({1, p_n, 4}, kF64, 4), priors, gt};
  LayerHarness with("MultiBoxLoss", Settings(), in);
  with.Forward();
  EXPECT_GT(static_cast<MultiBoxLossLayer&>(with.layer()).num_matched(), 0);
  Settings off;
  off.Set("use_difficult_gt", false);
  LayerHarness without("MultiBoxLoss", off, in);
  without.Forward();
  EXPECT_EQ(static_cast<MultiBoxLossLayer&>(without.layer()).num_matched(), 0);
}

TEST(MultiBoxLoss, BadGroundTruthNamesTheRow) {
  const Tensor priors = SmallPriors(kF32);
  const int64_t p_n = priors.dim(0);
  auto run = [&](const Tensor& gt) {
    return ErrorOf([&] {
      LayerHarness h(
          "MultiBoxLoss", Settings(),
          {RandomTensor({2, p_n, 3}, kF32, 1), RandomTensor({2, p_n, 4}, kF32, 2), priors, gt});
      h.Forward();
    });
  };
  EXPECT_NE(
      run(GroundTruth(kF32, {{0, 1, 0, 0.1, 0.1, 0.2, 0.2, 0}, {1, 3, 0, 0.1, 0.1, 0.2, 0.2, 0}}))
          .find("ground-truth row 1 of 'in3' has class 3; classes are 1 to 2"),
      std::string::npos);
  EXPECT_NE(run(GroundTruth(kF32, {{2, 1, 0, 0.1, 0.1, 0.2, 0.2, 0}}))
                .find("names item 2; the batch has items 0 to 1"),
            std::string::npos);
  EXPECT_NE(run(GroundTruth(kF32, {{0, 1, 0, 0.3, 0.1, 0.2, 0.2, 0}})).find("max corner"),
            std::string::npos);
  EXPECT_NE(run(Tensor({1, 3, 8}, kF32)).find("must be (1, 1, G, 8)"), std::string::npos);
}

// -------------------------------------------------------------------------------------------
// DetectionOutput.

// Two overlapping priors (IoU 0.82) and a third apart. Prior 0 outscores prior 1 in both
// classes, so prior 1 is suppressed in each; prior 2's class-1 score (0.0009) is under the
// threshold, its class-2 score the best of all.
TEST(DetectionOutput, SuppressesPerClassAndThresholds) {
  const Tensor priors =
      FromValues({3, 4}, kF64, {0.3, 0.3, 0.2, 0.2, 0.32, 0.3, 0.2, 0.2, 0.7, 0.7, 0.2, 0.2});
  // Logits (background, class 1, class 2) per prior.
  const Tensor logits = FromValues({1, 3, 3}, kF64, {0, 3, 2.5, 1, 1.5, 0.5, 0, -6, 0.5});
  Tensor regression({1, 3, 4}, kF64);
  regression.Zero();
  Settings s;
  s.Set("confidence_threshold", 0.01);
  LayerHarness h("DetectionOutput", s, {logits, regression, priors}, 1, Phase::kTest);
  h.Forward();
  const Tensor& out = h.top()[0]->data;
  auto softmax = [&](int p, int c) {
    const double* x = logits.data<double>() + 3 * p;
    return std::exp(x[c]) / (std::exp(x[0]) + std::exp(x[1]) + std::exp(x[2]));
  };
  // By score: class 2 of prior 2 (0.62), class 1 of prior 0 (0.60), class 2 of prior 0 (0.37).
  ASSERT_EQ(out.shape(), (Shape{1, 1, 3, 7}));
  const double* r = out.data<double>();
  const double want[3][7] = {{0, 2, softmax(2, 2), 0.6, 0.6, 0.8, 0.8},
                             {0, 1, softmax(0, 1), 0.2, 0.2, 0.4, 0.4},
                             {0, 2, softmax(0, 2), 0.2, 0.2, 0.4, 0.4}};
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 7; ++k) EXPECT_NEAR(r[7 * i + k], want[i][k], 1e-12) << i << "," << k;
  }
  // keep_top_k 2 keeps the best two; a threshold of 0.61 keeps prior 2's class 2 alone.
  s.Set("keep_top_k", 2);
  LayerHarness top2("DetectionOutput", s, {logits, regression, priors}, 1, Phase::kTest);
  top2.Forward();
  EXPECT_EQ(top2.top()[0]->data.dim(2), 2);
  Settings strict;
  strict.Set("confidence_threshold", 0.61);
  LayerHarness high("DetectionOutput", strict, {logits, regression, priors}, 1, Phase::kTest);
  high.Forward();
  EXPECT_EQ(high.top()[0]->data.dim(2), 1);
  // The train phase writes no rows.
  LayerHarness train("DetectionOutput", s, {logits, regression, priors}, 1, Phase::kTrain);
  train.Forward();
  EXPECT_EQ(train.top()[0]->data.shape(), (Shape{1, 1, 0, 7}));
}

// Decoding inverts the loss's encoding: a regression equal to a box's encoding against its
// prior gives the box back, in every image of the batch.
TEST(DetectionOutput, DecodesWhatTheLossEncodes) {
  const Tensor priors = FromValues({1, 4}, kF32, {0.5, 0.5, 0.4, 0.3});
  const double box[4] = {0.2, 0.3, 0.9, 0.6};
  const double gcx = 0.55, gcy = 0.45, gw = 0.7, gh = 0.3;
  const std::vector<double> t = {(gcx - 0.5) / 0.4 / 0.1, (gcy - 0.5) / 0.3 / 0.1,
                                 std::log(gw / 0.4) / 0.2, std::log(gh / 0.3) / 0.2};
  std::vector<double> loc;
  for (int i = 0; i < 2; ++i) loc.insert(loc.end(), t.begin(), t.end());
  LayerHarness h(
      "DetectionOutput", Settings(),
      {FromValues({2, 1, 2}, kF32, {0, 1, 0, 2}), FromValues({2, 1, 4}, kF32, loc), priors}, 1,
      Phase::kTest);
  h.Forward();
  const Tensor& out = h.top()[0]->data;
  ASSERT_EQ(out.shape(), (Shape{1, 1, 2, 7}));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out.data<float>()[7 * i], i);
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(out.data<float>()[7 * i + 3 + k], box[k], 1e-6);
  }
}

}  // namespace
}  // namespace cortado::testing
