// The ssd300_vgg16 builder (issue 44): torchvision's feature-map sizes and parameter count, a
// training step that reaches every parameter, detections from an inference net (planned memory,
// a batch size the plan was not made for), f32 ground truth in a bf16 net; and a small detector
// of the same parts (L2Norm, PriorBox, Permute, Reshape, Concat, MultiBoxLoss) gradient-checked
// as a whole net.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "engine/base/random.h"
#include "engine/graph/net.h"
#include "models/builders.h"

namespace cortado {
namespace {

ModelOptions Ssd(int64_t classes, int64_t batch) {
  ModelOptions o;
  o.num_classes = classes;
  o.in_channels = 3;
  o.height = o.width = 300;
  o.batch_size = batch;
  return o;
}

void FillImages(Tensor& data, uint64_t seed) {
  Rng rng(seed);
  for (int64_t i = 0; i < data.numel(); ++i) {
    const double v = rng.Uniform(-1, 1);
    if (data.dtype() == DType::kF64) {
      data.data<double>()[i] = v;
    } else if (data.dtype() == DType::kF32) {
      data.data<float>()[i] = static_cast<float>(v);
    } else {
      Tensor f(data.shape(), DType::kF32);
      for (int64_t j = 0; j < f.numel(); ++j)
        f.data<float>()[j] = static_cast<float>(rng.Uniform(-1, 1));
      data.ConvertFrom(f);
      return;
    }
  }
}

// (1, 1, G, 8) rows [item, label, instance, xmin, ymin, xmax, ymax, difficult].
void SetBoxes(Tensor& label, const std::vector<std::vector<float>>& rows) {
  label.Resize({1, 1, static_cast<int64_t>(rows.size()), 8}, DType::kF32);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::memcpy(label.data<float>() + 8 * r, rows[r].data(), 8 * sizeof(float));
  }
}

TEST(Ssd300Vgg16, TorchvisionsShapesParametersAndATrainingStep) {
  Net net(BuildModel("ssd300_vgg16", Ssd(21, 1)), /*seed=*/1);
  // torchvision's ssd300_vgg16(num_classes=21) has 26285486 parameters.
  EXPECT_EQ(net.num_parameters(), 26285486);
  FillImages(net.input("data"), 3);
  SetBoxes(net.input("label"),
           {{0, 12, 0, 0.1f, 0.2f, 0.2f, 0.3f, 0}, {0, 3, 1, 0.05f, 0.05f, 0.95f, 0.95f, 0}});
  const double loss = net.Forward();
  EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
  const std::pair<const char*, Shape> shapes[] = {{"backbone.conv4_3_norm", {1, 512, 38, 38}},
                                                  {"backbone.extra.0.7.4", {1, 1024, 19, 19}},
                                                  {"backbone.extra.1.3", {1, 512, 10, 10}},
                                                  {"backbone.extra.2.3", {1, 256, 5, 5}},
                                                  {"backbone.extra.3.3", {1, 256, 3, 3}},
                                                  {"backbone.extra.4.3", {1, 256, 1, 1}},
                                                  {"cls_logits", {1, 8732, 21}},
                                                  {"bbox_regression", {1, 8732, 4}},
                                                  {"priors", {8732, 4}},
                                                  {"detections", {1, 1, 0, 7}}};
  for (const auto& [name, shape] : shapes) {
    EXPECT_EQ(net.blob(name)->data.shape(), shape) << name;
  }
  net.Backward();
  // Every gradient is finite; the loss reaches the first convolution, the L2 norm's scale and
  // the heads of the maps whose priors match a box (the 0.1 x 0.1 box: map 0's 38x38, whose
  // smallest prior is 0.07; the 0.9 x 0.9 one: map 5's 1x1). A layer whose maps hold no matched
  // or mined prior, or whose ReLUs are all off for these random weights, may get none.
  std::map<std::string, double> norms;
  for (Param* p : net.params()) {
    double norm = 0;
    for (int64_t i = 0; i < p->grad.numel(); ++i) {
      const double g = p->grad.data<float>()[i];
      ASSERT_TRUE(std::isfinite(g)) << p->name << " element " << i;
      norm += g * g;
    }
    norms[p->name] = norm;
  }
  for (const char* name : {"backbone.features.0.weight", "backbone.conv4_3_norm.weight",
                           "head.classification_head.module_list.0.weight",
                           "head.regression_head.module_list.0.weight",
                           "head.classification_head.module_list.5.weight",
                           "head.regression_head.module_list.5.weight"}) {
    EXPECT_GT(norms.at(name), 0) << name;
  }
}

// Eval: an inference net plans its memory; detections come out in the test phase, the same as a
// training net's, and a smaller last batch replans without changing the first image's rows.
TEST(Ssd300Vgg16, InferenceNetDetectsAndReplansForAnotherBatch) {
  NetOptions inference;
  inference.mode = NetMode::kInference;
  Net eval(BuildModel("ssd300_vgg16", Ssd(4, 2)), /*seed=*/5, DType::kF32, inference);
  Net train(BuildModel("ssd300_vgg16", Ssd(4, 2)), /*seed=*/5);
  train.set_phase(Phase::kTest);
  FillImages(eval.input("data"), 7);
  train.input("data").CopyFrom(eval.input("data"));
  eval.Forward();
  train.Forward();
  const Tensor a = eval.blob("detections")->data.Clone();
  const Tensor& b = train.blob("detections")->data;
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_GT(a.dim(2), 0);
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  // The keep_top_k default of 200 per image, items 0 and 1 in order.
  EXPECT_LE(a.dim(2), 400);
  EXPECT_EQ(a.data<float>()[0], 0.0f);
  EXPECT_EQ(a.data<float>()[7 * (a.dim(2) - 1)], 1.0f);
  int64_t first = 0;
  while (first < a.dim(2) && a.data<float>()[7 * first] == 0.0f) ++first;
  // Image 0 alone.
  Tensor one({1, 3, 300, 300}, DType::kF32);
  std::memcpy(one.data<float>(), eval.input("data").data<float>(), one.nbytes());
  eval.SetBatchSize(1);
  eval.input("data").CopyFrom(one);
  eval.Forward();
  const Tensor& c = eval.blob("detections")->data;
  ASSERT_EQ(c.dim(2), first);
  EXPECT_EQ(std::memcmp(c.raw_data(), a.raw_data(), c.nbytes()), 0);
}

// Mixed precision: the boxes stay f32, the loss too.
TEST(Ssd300Vgg16, GroundTruthStaysF32InABF16Net) {
  Net net(BuildModel("ssd300_vgg16", Ssd(3, 1)), /*seed=*/1, DType::kBF16);
  EXPECT_EQ(net.input("data").dtype(), DType::kBF16);
  EXPECT_EQ(net.input("label").dtype(), DType::kF32);
  FillImages(net.input("data"), 3);
  SetBoxes(net.input("label"), {{0, 2, 0, 0.2f, 0.2f, 0.6f, 0.5f, 0}});
  const double loss = net.Forward();
  EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
  EXPECT_EQ(net.blob("loss")->data.dtype(), DType::kF32);
  EXPECT_EQ(net.blob("priors")->data.dtype(), DType::kF32);
}

TEST(Ssd300Vgg16, NumClassesCountsTheBackground) {
  try {
    BuildModel("ssd300_vgg16", Ssd(1, 1));
    ADD_FAILURE() << "one class (the background alone) was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("counts the background"), std::string::npos) << e.what();
  }
}

LayerSpec L(const std::string& name, const std::string& type, std::vector<std::string> in,
            Settings s = {}) {
  LayerSpec spec;
  spec.name = name;
  spec.type = type;
  spec.inputs = std::move(in);
  spec.outputs = {name};
  spec.settings = std::move(s);
  return spec;
}

// A two-map detector of the builder's parts, checked as one f64 net by central differences on
// every parameter: the Split in front of the heads, the head permutes and reshapes, the concat
// and the loss compose to the right gradient.
TEST(SmallDetector, NetGradientsMatchCentralDifferences) {
  NetSpec spec;
  spec.name = "small_ssd";
  spec.inputs = {{"data", {2, 3, 8, 8}, DType::kF32}, {"label", {1, 1, 3, 8}, DType::kF32, true}};
  auto conv = [](int64_t out, int64_t kernel, int64_t stride, int64_t pad) {
    Settings s;
    s.Set("num_output", out).Set("kernel", kernel).Set("stride", stride).Set("pad", pad);
    return s;
  };
  Settings norm, priors, permute, cat;
  norm.Set("scale_init", 2.0);
  priors.SetInts("aspect_ratios", {2, 2, 3}).SetInts("aspect_ratios_per_map", {1, 2});
  permute.SetInts("order", {0, 2, 3, 1});
  cat.Set("axis", int64_t{1});
  spec.layers = {L("c1", "Convolution", {"data"}, conv(4, 3, 2, 1)),  // 4x4
                 L("f0", "L2Norm", {"c1"}, norm),
                 L("c2", "Convolution", {"c1"}, conv(5, 3, 2, 1)),  // 2x2
                 L("f1", "ReLU", {"c2"}), L("priors", "PriorBox", {"f0", "f1", "data"}, priors)};
  const int64_t anchors[2] = {4, 6};
  std::vector<std::string> cls, reg;
  for (int k = 0; k < 2; ++k) {
    for (int kind = 0; kind < 2; ++kind) {
      const int64_t columns = kind == 0 ? 3 : 4;
      const std::string name = (kind == 0 ? "cls" : "reg") + std::to_string(k);
      Settings reshape;
      reshape.SetInts("shape", {0, -1, columns});
      spec.layers.push_back(
          L(name, "Convolution", {k == 0 ? "f0" : "f1"}, conv(anchors[k] * columns, 3, 1, 1)));
      spec.layers.push_back(L(name + "_nhwc", "Permute", {name}, permute));
      spec.layers.push_back(L(name + "_rows", "Reshape", {name + "_nhwc"}, reshape));
      (kind == 0 ? cls : reg).push_back(name + "_rows");
    }
  }
  spec.layers.push_back(L("cls_logits", "Concat", cls, cat));
  spec.layers.push_back(L("bbox_regression", "Concat", reg, cat));
  spec.layers.push_back(
      L("loss", "MultiBoxLoss", {"cls_logits", "bbox_regression", "priors", "label"}));
  Net net(spec, 3, DType::kF64);
  FillImages(net.input("data"), 11);
  SetBoxes(net.input("label"), {{0, 1, 0, 0.1f, 0.1f, 0.5f, 0.6f, 0},
                                {0, 2, 1, 0.55f, 0.3f, 0.95f, 0.9f, 0},
                                {1, 2, 0, 0.2f, 0.25f, 0.7f, 0.65f, 0}});
  EXPECT_EQ(net.blob("cls_logits")->data.shape(), (Shape{2, 88, 3}));
  net.Forward();
  net.Backward();
  const double eps = 1e-6;
  int64_t checked = 0;
  for (Param* p : net.params()) {
    const Tensor analytic = p->grad.Clone();
    for (int64_t i = 0; i < p->value.numel(); i += 5) {
      double& w = p->value.data<double>()[i];
      const double saved = w;
      w = saved + eps;
      const double plus = net.Forward();
      w = saved - eps;
      const double minus = net.Forward();
      w = saved;
      const double numeric = (plus - minus) / (2 * eps);
      EXPECT_NEAR(analytic.data<double>()[i], numeric, 1e-5 * std::max(1.0, std::fabs(numeric)))
          << p->name << " index " << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace cortado
