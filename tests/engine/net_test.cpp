#include "engine/net.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/random.h"
#include "engine/thread_pool.h"
#include "models/builders.h"

namespace cortado {
namespace {

LayerSpec L(const std::string& name, const std::string& type, std::vector<std::string> in,
            std::vector<std::string> out, Settings s = {}) {
  LayerSpec spec;
  spec.name = name;
  spec.type = type;
  spec.inputs = std::move(in);
  spec.outputs = std::move(out);
  spec.settings = std::move(s);
  return spec;
}

// data -> fc1 -> relu -> {fc2, skip} -> sum -> fc3 -> loss: the relu output fans out.
NetSpec ResidualSpec(int64_t batch) {
  NetSpec spec;
  spec.name = "residual";
  spec.inputs = {{"data", {batch, 5}, DType::kF32}, {"label", {batch}, DType::kI32}};
  Settings fc6, fc3;
  fc6.Set("num_output", int64_t{6});
  fc3.Set("num_output", int64_t{3});
  Settings sum;
  sum.Set("operation", "sum");
  spec.layers = {L("fc1", "InnerProduct", {"data"}, {"fc1"}, fc6),
                 L("relu", "ReLU", {"fc1"}, {"h"}),
                 L("fc2", "InnerProduct", {"h"}, {"fc2"}, fc6),
                 L("sum", "Eltwise", {"fc2", "h"}, {"s"}, sum),
                 L("fc3", "InnerProduct", {"s"}, {"logits"}, fc3),
                 L("loss", "SoftmaxWithLoss", {"logits", "label"}, {"loss"}),
                 L("acc", "Accuracy", {"logits", "label"}, {"acc"})};
  return spec;
}

void FillInputs(Net& net, int64_t batch) {
  Tensor& x = net.input("data");
  Rng rng(7);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = rng.Uniform(-1, 1);
  for (int64_t i = 0; i < batch; ++i) net.input("label").data<int32_t>()[i] = i % 3;
}

TEST(Net, InsertsSplitForFanOutWithGradient) {
  Net net(ResidualSpec(4), 1, DType::kF64);
  int splits = 0;
  for (auto& layer : net.layers()) splits += layer->type() == "Split";
  // `h` fans out to fc2 and sum (gradient), `logits` to loss and acc (gradient); labels do not.
  EXPECT_EQ(splits, 2);
}

TEST(Net, GradientCheckThroughSplitAndEltwise) {
  SetNumThreads(2);
  const int64_t batch = 4;
  Net net(ResidualSpec(batch), 3, DType::kF64);
  FillInputs(net, batch);
  net.Forward();
  net.Backward();
  std::vector<Param*> params = net.params();
  ASSERT_EQ(params.size(), 6u);
  const double eps = 1e-6;
  for (Param* p : params) {
    Tensor analytic = p->grad.Clone();
    for (int64_t i = 0; i < p->value.numel(); i += 3) {
      double& w = p->value.data<double>()[i];
      double saved = w;
      w = saved + eps;
      double plus = net.Forward();
      w = saved - eps;
      double minus = net.Forward();
      w = saved;
      double numeric = (plus - minus) / (2 * eps);
      double a = analytic.data<double>()[i];
      EXPECT_NEAR(a, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << p->name << " index " << i;
    }
  }
}

TEST(Net, GradReadyHookRunsInReverseLayerOrder) {
  Net net(ResidualSpec(2), 1, DType::kF32);
  std::vector<std::string> order;
  net.set_grad_ready_hook(
      [&](Layer& layer, std::vector<Param>&) { order.push_back(layer.name()); });
  net.Forward();
  net.Backward();
  EXPECT_EQ(order, (std::vector<std::string>{"fc3", "fc2", "fc1"}));
}

TEST(Net, GraphErrorsNameLayerAndBlob) {
  NetSpec spec = ResidualSpec(2);
  spec.layers[2].inputs = {"nope"};
  try {
    Net net(spec, 1);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("layer 'fc2'"), std::string::npos) << m;
    EXPECT_NE(m.find("'nope'"), std::string::npos) << m;
  }
  spec = ResidualSpec(2);
  spec.layers[1].type = "Relu";
  try {
    Net net(spec, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown type 'Relu'"), std::string::npos) << e.what();
  }
  spec = ResidualSpec(2);
  spec.layers[0].settings.Set("num_ouptut", int64_t{3});
  EXPECT_THROW(Net(spec, 1), Error);
}

TEST(Models, LeNetAndResNet20MatchTorchParameterCounts) {
  ModelOptions o;
  o.num_classes = 10;
  o.in_channels = 1;
  o.batch_size = 2;
  // torch: sum(p.numel() for p in model.parameters()) of the same definitions
  // (scripts/bench/train_torch.py), torch 1.13.
  EXPECT_EQ(Net(BuildModel("lenet", o), 1).num_parameters(), 1663370);
  EXPECT_EQ(Net(BuildModel("resnet20", o), 1).num_parameters(), 272186);
  EXPECT_THROW(BuildModel("lenet5", o), Error);
}

TEST(Models, ImageNetResNetsMatchTorchvisionParameterCounts) {
  ModelOptions o;
  o.num_classes = 1000;
  o.in_channels = 3;
  o.height = o.width = 64;  // the count does not depend on the input size
  // torchvision 0.14 resnet18() / resnet50(): sum(p.numel() for p in m.parameters())
  EXPECT_EQ(Net(BuildModel("resnet18", o), 1).num_parameters(), 11689512);
  EXPECT_EQ(Net(BuildModel("resnet50", o), 1).num_parameters(), 25557032);
}

TEST(Models, VggsMatchTorchvisionParameterCounts) {
  ModelOptions o;
  o.num_classes = 1000;
  o.in_channels = 3;
  // torchvision 0.14 vgg11() ... vgg16_bn(): sum(p.numel() for p in m.parameters()). Its
  // classifier reads a 7x7 map (adaptive pool); Cortado's reads H/32 x W/32, the same at 224.
  // At 32x32 the map is 1x1, so the first fc has 48 x 512 x 4096 fewer weights. (Built at 224
  // the nets hold 1 GB of weights and gradients and take seconds to initialize: checked once
  // by hand, equal.) Two of the four: one per depth, with and without batch norm.
  o.height = o.width = 32;
  EXPECT_EQ(Net(BuildModel("vgg11", o), 1).num_parameters() + 48 * 512 * 4096, 132863336);
  EXPECT_EQ(Net(BuildModel("vgg16_bn", o), 1).num_parameters() + 48 * 512 * 4096, 138365992);
  // The other two differ from them by their stage depths and BN parameters alone.
  const NetSpec vgg16 = BuildModel("vgg16", o), vgg11_bn = BuildModel("vgg11_bn", o);
  auto count = [](const NetSpec& spec, const std::string& type) {
    return std::count_if(spec.layers.begin(), spec.layers.end(),
                         [&](const LayerSpec& l) { return l.type == type; });
  };
  EXPECT_EQ(count(vgg16, "Convolution"), 13);
  EXPECT_EQ(count(vgg16, "BatchNorm"), 0);
  EXPECT_EQ(count(vgg11_bn, "Convolution"), 8);
  EXPECT_EQ(count(vgg11_bn, "BatchNorm"), 8);
}

TEST(Models, VggRunsAt32AndNamesItsLayersAsTorchvision) {
  ModelOptions o;
  o.num_classes = 10;
  o.in_channels = 3;
  o.height = o.width = 32;
  o.batch_size = 2;
  Net net(BuildModel("vgg11_bn", o), 1);
  std::vector<std::string> names;
  for (const Param* p : net.params()) names.push_back(p->name);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "features.0.weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "features.1.weight"), names.end());  // BN
  EXPECT_NE(std::find(names.begin(), names.end(), "classifier.3.bias"), names.end());
  EXPECT_EQ(names.back(), "logits.bias");
  net.Forward();
  EXPECT_EQ(net.blob("logits")->data.shape(), (Shape{2, 10}));
}

TEST(Models, ResNet20RunsAt28And32) {
  for (int64_t side : {28, 32}) {
    ModelOptions o;
    o.height = o.width = side;
    o.in_channels = 3;
    o.batch_size = 2;
    Net net(BuildModel("resnet20", o), 1);
    net.Forward();
    EXPECT_EQ(net.blob("logits")->data.shape(), (Shape{2, 10}));
  }
}

}  // namespace
}  // namespace cortado
