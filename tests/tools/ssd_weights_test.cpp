// ssd300_vgg16 against torchvision (issue 44): a torchvision ssd300_vgg16 with random weights,
// written at test time by tests/make_ssd_golden.py (its 97 MB of weights are not committed),
// loads through the --weights code path (LoadWeights) and gives torchvision's class logits and
// box regressions for the same input; the exported names and shapes are torchvision's
// state_dict; fine-tuning to another class count replaces only the classification head.
// Skipped, saying why, where /usr/bin/python3 has no torch and torchvision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/graph/net.h"
#include "models/builders.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"
#include "tools/weights.h"

namespace cortado::tools {
namespace {

using testing::TempDir;
using tooltest::RunShell;

constexpr int64_t kClasses = 5;  // the file's: 4 classes and the background

ModelOptions SsdOptions(int64_t classes) {
  ModelOptions o;
  o.num_classes = classes;
  o.in_channels = 3;
  o.height = o.width = 300;
  o.batch_size = 1;
  return o;
}

// max |got - want| / max |want|: the error relative to the output's scale.
double RelativeError(const Tensor& got, const Tensor& want, double* max_diff) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    diff = std::max(diff, std::fabs(ElementAsDouble(got, i) - ElementAsDouble(want, i)));
    scale = std::max(scale, std::fabs(ElementAsDouble(want, i)));
  }
  if (max_diff != nullptr) *max_diff = diff;
  return diff / scale;
}

class SsdWeights : public ::testing::Test {
 protected:
  // The script runs once for the suite; skip_ says why it could not.
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    const std::string python = "timeout 300 /usr/bin/python3";
    if (RunShell(python + " -c 'import torch, torchvision'", nullptr, nullptr) != 0) {
      skip_ = "/usr/bin/python3 has no torch and torchvision to write the golden model";
      return;
    }
    std::string out, err;
    const int rc = RunShell(python + " " + CORTADO_SOURCE_DIR + "/tests/make_ssd_golden.py " +
                                dir_->path() + " " + std::to_string(kClasses),
                            &out, &err);
    if (rc != 0) failure_ = "tests/make_ssd_golden.py failed: " + out + err;
  }
  static void TearDownTestSuite() { dir_.reset(); }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(failure_.empty()) << failure_;
  }
  static std::string Path(const std::string& name) { return (*dir_) / name; }

  static std::unique_ptr<TempDir> dir_;
  static std::string skip_, failure_;
};
std::unique_ptr<TempDir> SsdWeights::dir_;
std::string SsdWeights::skip_, SsdWeights::failure_;

// The head's outputs within 1e-4 of torchvision's, relative to each output's largest magnitude:
// max_i |ours_i - theirs_i| <= 1e-4 max_i |theirs_i|, for cls_logits and bbox_regression alike.
TEST_F(SsdWeights, TorchvisionsWeightsGiveTorchvisionsHeadOutputs) {
  const Safetensors io = LoadSafetensors(Path("ssd300_vgg16.io.safetensors"));
  const std::string path = Path("ssd300_vgg16.safetensors");
  const Safetensors file = LoadSafetensors(path);
  Net net(BuildModel("ssd300_vgg16", SsdOptions(kClasses)), /*seed=*/1);
  const WeightsReport r = LoadWeights(net, "ssd300_vgg16", file, path, /*strict=*/true);
  EXPECT_EQ(static_cast<size_t>(r.loaded), net.params().size());
  EXPECT_EQ(net.params().size(), file.entries.size());  // 71: every tensor has its place
  net.input("data").CopyFrom(io.Find("input")->ToTensor());
  net.set_phase(Phase::kTest);
  net.Forward();
  for (const char* name : {"cls_logits", "bbox_regression"}) {
    SCOPED_TRACE(name);
    const Tensor want = io.Find(name)->ToTensor();
    const Tensor& got = net.blob(name)->data;
    ASSERT_EQ(got.shape(), want.shape());
    double diff = 0;
    const double rel = RelativeError(got, want, &diff);
    EXPECT_LT(rel, 1e-4) << "largest |difference| " << diff;
  }
  // The test phase's detections are rows of (1, 1, D, 7) with classes 1 .. 4.
  const Tensor& dets = net.blob("detections")->data;
  ASSERT_EQ(dets.ndim(), 4);
  EXPECT_GT(dets.dim(2), 0);
  for (int64_t d = 0; d < dets.dim(2); ++d) {
    const double label = ElementAsDouble(dets, 7 * d + 1);
    ASSERT_TRUE(label >= 1 && label < kClasses) << label;
  }

  // Teeth: one scale of the conv4_3 L2 norm (torchvision's backbone.scale_weight, mapped to the
  // L2Norm's weight) doubled changes the outputs of the first feature map's priors.
  Safetensors changed = file;
  for (SafetensorsEntry& e : changed.entries) {
    if (e.name == "backbone.scale_weight") reinterpret_cast<float*>(e.bytes.data())[7] *= 2;
  }
  LoadWeights(net, "ssd300_vgg16", changed, path, /*strict=*/true);
  net.Forward();
  EXPECT_GT(RelativeError(net.blob("cls_logits")->data, io.Find("cls_logits")->ToTensor(), nullptr),
            1e-4);
}

// Fine-tuning the 5-class file into a 21-class (VOC) model: only the six class-logit
// convolutions differ in shape, which is fine-tuning's business, not another architecture.
TEST_F(SsdWeights, FineTuningToAnotherClassCountReplacesOnlyTheClassificationHead) {
  const std::string path = Path("ssd300_vgg16.safetensors");
  const Safetensors file = LoadSafetensors(path);
  Net net(BuildModel("ssd300_vgg16", SsdOptions(21)), /*seed=*/1);
  const WeightsReport r = LoadWeights(net, "ssd300_vgg16", file, path, /*strict=*/false);
  EXPECT_EQ(r.resized.size(), 12u);
  for (const std::string& what : r.resized) {
    EXPECT_EQ(what.rfind("head.classification_head.module_list.", 0), 0u) << what;
  }
  EXPECT_EQ(static_cast<size_t>(r.loaded), net.params().size() - 12);
  EXPECT_TRUE(r.outside_classifier.empty()) << r.Summary(path);
  EXPECT_NO_THROW(CheckFineTuning(r, path, /*partial=*/false));
  // A regression head of another shape is not fine-tuning: refused.
  Safetensors other = file;
  for (SafetensorsEntry& e : other.entries) {
    if (e.name == "head.regression_head.module_list.5.bias") {
      e.shape = {8};
      e.bytes.resize(8 * sizeof(float));
    }
  }
  const WeightsReport bad = LoadWeights(net, "ssd300_vgg16", other, path, /*strict=*/false);
  EXPECT_THROW(CheckFineTuning(bad, path, /*partial=*/false), Error);
}

// The exported file's names and shapes are torchvision's ssd300_vgg16(num_classes=21)
// state_dict (tests/testdata/torchvision/ssd300_vgg16.keys.txt); runs without torch.
TEST(SsdExport, NamesAndShapesAreTorchvisionsStateDict) {
  std::ifstream in(std::string(CORTADO_SOURCE_DIR) +
                   "/tests/testdata/torchvision/ssd300_vgg16.keys.txt");
  std::vector<std::string> theirs;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') theirs.push_back(line);
  }
  ASSERT_EQ(theirs.size(), 71u);
  Net net(BuildModel("ssd300_vgg16", SsdOptions(21)), 1);
  Checkpoint ckpt;
  net.SaveState(ckpt);
  std::vector<std::string> ours;
  for (const SafetensorsEntry& e : ExportWeights(ckpt, "ssd300_vgg16").entries) {
    std::string shape;
    for (size_t i = 0; i < e.shape.size(); ++i) {
      shape += (i ? "x" : "") + std::to_string(e.shape[i]);
    }
    ours.push_back(e.name + " " + shape);
  }
  std::sort(ours.begin(), ours.end());
  std::sort(theirs.begin(), theirs.end());
  EXPECT_EQ(ours, theirs);
}

}  // namespace
}  // namespace cortado::tools
