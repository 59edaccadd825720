// Weights files against PyTorch: torchvision models with random weights, written by
// tests/make_torchvision_golden.py, give the same logits here; exported names and shapes equal
// torchvision's state_dict of the published architectures; fine-tuning loads what fits.
#include "tools/weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/base/error.h"
#include "engine/graph/net.h"
#include "models/builders.h"
#include "tests/support/errors.h"

namespace cortado::tools {
namespace {

using testing::ErrorOf;

const std::string kGolden = std::string(CORTADO_SOURCE_DIR) + "/tests/testdata/torchvision/";

ModelOptions Options(int64_t classes, int64_t side, int64_t batch, int64_t base_width) {
  ModelOptions o;
  o.num_classes = classes;
  o.in_channels = 3;
  o.height = o.width = side;
  o.batch_size = batch;
  o.base_width = base_width;
  return o;
}

// Largest |a - b| over largest |b|.
double RelativeError(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, std::fabs(double{a.data<float>()[i]} - b.data<float>()[i]));
    scale = std::max(scale, std::fabs(double{b.data<float>()[i]}));
  }
  return diff / scale;
}

void ExpectTorchLogits(const std::string& builder, const std::string& name) {
  SCOPED_TRACE(name);
  const Safetensors io = LoadSafetensors(kGolden + name + ".io.safetensors");
  const Tensor input = io.Find("input")->ToTensor();
  const Tensor logits = io.Find("logits")->ToTensor();
  Net net(BuildModel(builder, Options(10, 64, 2, 8)), /*seed=*/1);
  const std::string path = kGolden + name + ".safetensors";
  const WeightsReport r = LoadWeights(net, builder, LoadSafetensors(path), path, /*strict=*/true);
  EXPECT_EQ(static_cast<size_t>(r.loaded), net.params().size() + net.buffers().size());
  net.input("data").CopyFrom(input);
  std::memset(net.input("label").raw_data(), 0, net.input("label").nbytes());
  net.set_phase(Phase::kTest);
  net.Forward();
  const Tensor& out = net.blob("logits")->data;
  ASSERT_EQ(out.shape(), logits.shape());
  EXPECT_LT(RelativeError(out, logits), 1e-4);
  // A model that is not the one the file was written for gives other logits: the check has
  // teeth (here: the same file with one batch-norm statistic perturbed).
  Safetensors changed = LoadSafetensors(path);
  for (SafetensorsEntry& e : changed.entries) {
    if (e.name == "layer1.0.bn1.running_var") reinterpret_cast<float*>(e.bytes.data())[0] *= 4;
  }
  LoadWeights(net, builder, changed, path, /*strict=*/true);
  net.Forward();
  EXPECT_GT(RelativeError(net.blob("logits")->data, logits), 1e-4);
}

TEST(Weights, TorchvisionResNet18And50GiveTorchsLogits) {
  ExpectTorchLogits("resnet18", "resnet18_w8");
  ExpectTorchLogits("resnet50", "resnet50_w8");
}

// "name shape" lines of a .keys.txt file (torchvision's state_dict), and the same of an export.
std::vector<std::string> TorchKeys(const std::string& name) {
  std::ifstream in(kGolden + name + ".keys.txt");
  std::vector<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') keys.push_back(line);
  }
  return keys;
}

std::vector<std::string> ExportedKeys(Net& net, const std::string& builder) {
  Checkpoint ckpt;
  net.SaveState(ckpt);
  std::vector<std::string> keys;
  for (const SafetensorsEntry& e : ExportWeights(ckpt, builder).entries) {
    std::string shape;
    for (size_t i = 0; i < e.shape.size(); ++i)
      shape += (i ? "x" : "") + std::to_string(e.shape[i]);
    keys.push_back(e.name + " " + (shape.empty() ? "scalar" : shape));
  }
  return keys;
}

TEST(Weights, ExportedNamesAndShapesAreTorchvisionsStateDict) {
  for (const std::string builder : {"resnet18", "resnet50"}) {
    SCOPED_TRACE(builder);
    Net net(BuildModel(builder, Options(1000, 224, 1, 0)), 1);
    std::vector<std::string> ours = ExportedKeys(net, builder), theirs = TorchKeys(builder);
    ASSERT_FALSE(theirs.empty());
    std::sort(ours.begin(), ours.end());
    std::sort(theirs.begin(), theirs.end());
    EXPECT_EQ(ours, theirs);
  }
  // VGG at 32x32 (at 224 the net holds 1 GB): the first fc reads 512 x 1 x 1 instead of 7 x 7.
  Net vgg(BuildModel("vgg16_bn", Options(1000, 32, 1, 0)), 1);
  std::vector<std::string> ours = ExportedKeys(vgg, "vgg16_bn"), theirs = TorchKeys("vgg16_bn");
  for (std::string& k : theirs) {
    if (k == "classifier.0.weight 4096x25088") k = "classifier.0.weight 4096x512";
  }
  std::sort(ours.begin(), ours.end());
  std::sort(theirs.begin(), theirs.end());
  EXPECT_EQ(ours, theirs);
}

TEST(Weights, FineTuningLeavesWhatDoesNotFitAndStrictRefusesIt) {
  const std::string path = kGolden + "resnet18_w8.safetensors";
  const Safetensors file = LoadSafetensors(path);
  Net net(BuildModel("resnet18", Options(5, 64, 2, 8)), 1);  // 5 classes instead of 10
  const Tensor before = net.params().back()->value;          // fc.bias, freshly initialized
  const WeightsReport r = LoadWeights(net, "resnet18", file, path, /*strict=*/false);
  EXPECT_EQ(static_cast<size_t>(r.loaded), net.params().size() + net.buffers().size() - 2);
  ASSERT_EQ(r.resized.size(), 2u);
  EXPECT_NE(r.resized[0].find("fc.weight ([10, 64] in the file, [5, 64] in the model)"),
            std::string::npos)
      << r.resized[0];
  EXPECT_TRUE(r.missing.empty());
  EXPECT_NO_THROW(CheckFineTuning(r, path, /*partial=*/false));  // only the classifier differs
  EXPECT_EQ(std::memcmp(before.raw_data(), net.params().back()->value.raw_data(), before.nbytes()),
            0);
  const std::string line = r.Summary(path);
  EXPECT_NE(line.find("100 tensor(s) loaded"), std::string::npos) << line;
  EXPECT_NE(line.find("2 left at initialization (shape differs): fc.weight"), std::string::npos)
      << line;
  // The loaded ones hold the file's values.
  const Tensor conv1 = file.Find("conv1.weight")->ToTensor();
  EXPECT_EQ(std::memcmp(conv1.raw_data(), net.params().front()->value.raw_data(), conv1.nbytes()),
            0);
  try {
    LoadWeights(net, "resnet18", file, path, /*strict=*/true);
    ADD_FAILURE() << "strict loading accepted another class count";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc.weight ([10, 64] in the file"), std::string::npos)
        << e.what();
  }
  // Another architecture's file: nothing fits, and the error says so.
  Net lenet(BuildModel("lenet", Options(10, 28, 1, 0)), 1);
  try {
    LoadWeights(lenet, "lenet", file, path, /*strict=*/false);
    ADD_FAILURE() << "a ResNet file loaded into LeNet";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fits the model"), std::string::npos) << e.what();
  }
}

// Issue 40, item 3: resnet34's file holds every tensor of resnet18 in the same shape, so only its
// extra blocks, unused, tell that it is another architecture's; unused outside the classifier is
// refused unless partial, inside it (fine-tuning) it is not.
TEST(Weights, ALargerArchitecturesFileIsRefusedUnlessPartial) {
  Net r34(BuildModel("resnet34", Options(10, 32, 1, 8)), 1);
  Checkpoint ckpt;
  r34.SaveState(ckpt);
  const Safetensors file = ExportWeights(ckpt, "resnet34");
  Net r18(BuildModel("resnet18", Options(10, 32, 1, 8)), 2);
  const WeightsReport r = LoadWeights(r18, "resnet18", file, "r34.safetensors", /*strict=*/false);
  EXPECT_EQ(static_cast<size_t>(r.loaded), r18.params().size() + r18.buffers().size());
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.resized.empty());
  EXPECT_EQ(r.unused.size(), 80u);  // 8 more basic blocks of 2 convolutions and 2 batch norms
  EXPECT_EQ(r.outside_classifier.size(), 80u);
  const std::string message = ErrorOf([&] { CheckFineTuning(r, "r34.safetensors", false); });
  EXPECT_NE(message.find("weights file 'r34.safetensors' does not fit the model outside its final "
                         "classifier (80 tensor(s): layer1.2.conv1.weight (not in the model)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--weights-partial"), std::string::npos) << message;
  EXPECT_NO_THROW(CheckFineTuning(r, "r34.safetensors", /*partial=*/true));

  // A tensor the net has no place for inside the classifier is fine-tuning's business: allowed.
  Safetensors extra = file;
  std::erase_if(extra.entries, [](const SafetensorsEntry& e) {
    for (const char* block : {"layer1.2.", "layer2.2.", "layer2.3.", "layer3.2.", "layer3.3.",
                              "layer3.4.", "layer3.5.", "layer4.2."}) {
      if (e.name.starts_with(block)) return true;
    }
    return false;
  });
  extra.Add("fc.scale", Tensor({10}, DType::kF32));
  const WeightsReport fine = LoadWeights(r18, "resnet18", extra, "extra", /*strict=*/false);
  EXPECT_EQ(fine.unused, std::vector<std::string>{"fc.scale"});
  EXPECT_NO_THROW(CheckFineTuning(fine, "extra", /*partial=*/false));
}

TEST(Weights, ExportThenLoadReproducesEveryTensorAndConvertsHalfPrecision) {
  Net a(BuildModel("resnet18", Options(10, 32, 1, 8)), 1);
  Net b(BuildModel("resnet18", Options(10, 32, 1, 8)), 2);  // another seed
  Checkpoint ckpt;
  a.SaveState(ckpt);
  const Safetensors file = ExportWeights(ckpt, "resnet18");
  EXPECT_NE(file.Find("layer2.0.downsample.0.weight"), nullptr);
  EXPECT_NE(file.Find("layer2.0.downsample.1.running_var"), nullptr);
  EXPECT_NE(file.Find("bn1.num_batches_tracked"), nullptr);
  LoadWeights(b, "resnet18", ParseSafetensors(SerializeSafetensors(file), "mem"), "mem", true);
  for (size_t i = 0; i < a.params().size(); ++i) {
    EXPECT_EQ(std::memcmp(a.params()[i]->value.raw_data(), b.params()[i]->value.raw_data(),
                          a.params()[i]->value.nbytes()),
              0)
        << a.params()[i]->name;
  }
  // Stored as bf16, the weights arrive rounded to bf16 and converted to f32.
  Safetensors half;
  for (const SafetensorsEntry& e : file.entries) {
    if (e.dtype != "F32") {
      half.AddRaw(e);
      continue;
    }
    Tensor f = e.ToTensor(), h(f.shape(), DType::kBF16);
    h.ConvertFrom(f);
    half.Add(e.name, h);
  }
  LoadWeights(b, "resnet18", half, "half", true);
  const float w = a.params()[0]->value.data<float>()[3];
  EXPECT_EQ(b.params()[0]->value.data<float>()[3], BFloat16ToFloat(FloatToBFloat16(w)));
}

TEST(Weights, NamesOutsideTorchvisionsArchitecturesStayCortados) {
  EXPECT_EQ(TorchvisionName("resnet50", "layer3.0.proj_bn.running_mean"),
            "layer3.0.downsample.1.running_mean");
  EXPECT_EQ(TorchvisionName("resnet50", "logits.weight"), "fc.weight");
  EXPECT_EQ(TorchvisionName("vgg11", "logits.bias"), "classifier.6.bias");
  EXPECT_EQ(TorchvisionName("vgg11", "features.3.weight"), "features.3.weight");
  EXPECT_EQ(TorchvisionName("resnet20", "stage2.block1.proj.weight"), "stage2.block1.proj.weight");
  EXPECT_EQ(TorchvisionName("", "logits.weight"), "logits.weight");
}

}  // namespace
}  // namespace cortado::tools
