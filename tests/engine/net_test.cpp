#include "engine/graph/net.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/base/error.h"
#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/tensor/buffer_pool.h"
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

TEST(BufferPool, HandsBackTheBestFittingStorageAndRefusesForeignTensors) {
  BufferPool pool;
  Tensor a = pool.Acquire({100}, DType::kF32), b = pool.Acquire({10}, DType::kF64);
  const void* a_data = a.raw_data();
  const void* b_data = b.raw_data();
  EXPECT_EQ(pool.bytes_created(), 480u);
  pool.Release(a);
  pool.Release(b);
  EXPECT_EQ(a.raw_data(), nullptr);
  // 60 bytes fit both; the smaller (b's 80) is taken, in another shape and dtype.
  Tensor c = pool.Acquire({3, 5}, DType::kF32);
  EXPECT_EQ(c.raw_data(), b_data);
  EXPECT_EQ(c.shape(), (Shape{3, 5}));
  Tensor d = pool.Acquire({100}, DType::kF32);
  EXPECT_EQ(d.raw_data(), a_data);
  EXPECT_EQ(pool.bytes_created(), 480u);        // nothing new
  Tensor e = pool.Acquire({101}, DType::kF32);  // too big for anything free: new storage
  EXPECT_EQ(pool.bytes_created(), 884u);
  Tensor stranger({4}, DType::kF32);
  EXPECT_THROW(pool.Release(stranger), Error);
}

// Activation gradients live only from their consumer's backward to their producer's: a deep
// net holds a few at a time, a second step allocates nothing, and the results do not change.
TEST(Net, ActivationGradientsAreRecycledAndGiveTheSameGradients) {
  SetNumThreads(2);
  ModelOptions o;
  o.in_channels = 3;
  o.height = o.width = 16;
  o.batch_size = 4;
  Net net(BuildModel("resnet20", o), 5);
  Rng rng(3);
  Tensor& x = net.input("data");
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.Normal(0, 1));
  for (int64_t i = 0; i < 4; ++i) net.input("label").data<int32_t>()[i] = static_cast<int32_t>(i);
  net.Forward();
  net.Backward();
  size_t activations = 0;
  for (auto& layer : net.layers()) {
    if (layer->type() == "Accuracy") continue;
    activations += net.blob(layer->spec().outputs[0])->data.nbytes();
  }
  const size_t peak = net.grad_bytes_peak();
  EXPECT_GT(peak, 0u);
  EXPECT_LT(peak * 5, activations) << "gradient memory " << peak << " of " << activations;
  std::vector<Tensor> first;
  for (Param* p : net.params()) first.push_back(p->grad.Clone());
  net.Forward();
  net.Backward();
  EXPECT_EQ(net.grad_bytes_peak(), peak);
  // The convolutions' column buffers are the net's, one set for all of them.
  ASSERT_NE(net.context().scratch, nullptr);
  EXPECT_FALSE(net.context().scratch->Buffers(0).empty());
  const std::vector<Param*> params = net.params();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(std::memcmp(first[i].raw_data(), params[i]->grad.raw_data(), first[i].nbytes()), 0)
        << params[i]->name;
  }
}

// ReLU (and a sum, into its input 0) overwrites its input where nothing else reads it and its
// producer's backward does not: after InnerProduct, BatchNorm, a convolution or a sum; not on
// a net input, not on a blob that fans out, not after a layer that reads its output in
// backward (a ReLU), not when leaky with a negative slope (the output's sign would not be the
// input's).
TEST(Net, ReluRunsInPlaceExactlyWhereNothingElseNeedsItsInput) {
  NetSpec spec;
  spec.name = "inplace";
  spec.inputs = {{"data", {4, 5}, DType::kF64}, {"label", {4}, DType::kI32}};
  Settings fc;
  fc.Set("num_output", int64_t{3});
  Settings leaky;
  leaky.Set("negative_slope", -0.5);
  Settings sum;
  sum.Set("operation", "sum");
  spec.layers = {L("r0", "ReLU", {"data"}, {"r0"}),
                 L("fc1", "InnerProduct", {"r0"}, {"fc1"}, fc),
                 L("r1", "ReLU", {"fc1"}, {"r1"}),
                 L("r2", "ReLU", {"r1"}, {"r2"}),
                 L("fc2", "InnerProduct", {"r2"}, {"fc2"}, fc),
                 L("r3", "ReLU", {"fc2"}, {"r3"}, leaky),
                 L("fc3", "InnerProduct", {"r3"}, {"fc3"}, fc),
                 L("r4", "ReLU", {"fc3"}, {"r4"}),
                 L("sum", "Eltwise", {"r4", "fc3"}, {"s"}, sum),
                 L("r5", "ReLU", {"s"}, {"r5"}),
                 L("fc4", "InnerProduct", {"r5"}, {"fc4"}, fc),
                 L("fc5", "InnerProduct", {"r1"}, {"fc5"}, fc),
                 L("sum2", "Eltwise", {"fc4", "fc5"}, {"logits"}, sum),
                 L("loss", "SoftmaxWithLoss", {"logits", "label"}, {"loss"})};
  Net net(spec, 1, DType::kF64);
  std::map<std::string, bool> in_place;
  for (auto& layer : net.layers()) in_place[layer->name()] = layer->in_place();
  EXPECT_FALSE(in_place["r0"]) << "a net input";
  EXPECT_TRUE(in_place["r1"]) << "after InnerProduct";
  EXPECT_FALSE(in_place["r2"]) << "after a ReLU, whose backward reads its output";
  EXPECT_FALSE(in_place["r3"]) << "negative slope";
  EXPECT_FALSE(in_place["r4"]) << "fc3 fans out (a Split shares its output)";
  EXPECT_TRUE(in_place["r5"]) << "after Eltwise";
  EXPECT_FALSE(in_place["sum"]) << "input 0 comes from a ReLU";
  EXPECT_TRUE(in_place["sum2"]) << "a sum into input 0, an InnerProduct's output";
  // The in-place ones still give exact gradients (checked numerically, f64).
  FillInputs(net, 4);
  net.Forward();
  net.Backward();
  for (Param* p : net.params()) {
    Tensor analytic = p->grad.Clone();
    for (int64_t i = 0; i < p->value.numel(); i += 2) {
      double& w = p->value.data<double>()[i];
      const double saved = w;
      w = saved + 1e-6;
      const double plus = net.Forward();
      w = saved - 1e-6;
      const double minus = net.Forward();
      w = saved;
      const double numeric = (plus - minus) / 2e-6;
      EXPECT_NEAR(analytic.data<double>()[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
          << p->name << " index " << i;
    }
  }
}

TEST(Net, ActivationBytesCountSharedStorageOnceAndHalveInBF16) {
  Net f32(ResidualSpec(4), 1, DType::kF32);
  Net bf16(ResidualSpec(4), 1, DType::kBF16);
  f32.Forward();
  bf16.Forward();
  // The i32 labels (4 x 4 bytes) and the f32 loss and accuracy (4 bytes each) keep their size;
  // every other activation is half as large in bf16.
  const size_t fixed = 4 * 4 + 4 + 4;
  ASSERT_GT(f32.activation_bytes(), fixed);
  EXPECT_EQ(bf16.activation_bytes() - fixed, (f32.activation_bytes() - fixed) / 2);
  // data 4x5, fc1 4x6 (relu writes into it, the split shares it), fc2 4x6 (the sum accumulates
  // into it), logits 4x3: 20 + 24 + 24 + 12 = 80 floats.
  EXPECT_EQ(f32.activation_bytes() - fixed, 80 * sizeof(float));
}

// A floating input takes the compute dtype unless it keeps its own (detection's f32 boxes).
TEST(Net, FloatInputsTakeTheComputeDTypeUnlessKept) {
  NetSpec spec;
  spec.name = "inputs";
  spec.inputs = {{"data", {2, 3}, DType::kF32}, {"boxes", {1, 1, 0, 8}, DType::kF32, true}};
  Settings fc;
  fc.Set("num_output", int64_t{2});
  spec.layers = {L("fc", "InnerProduct", {"data"}, {"fc"}, fc)};
  for (DType dtype : {DType::kF64, DType::kBF16, DType::kF16}) {
    Net net(spec, 1, dtype);
    EXPECT_EQ(net.input("data").dtype(), dtype);
    EXPECT_EQ(net.input("boxes").dtype(), DType::kF32);
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

// Issue 40, item 6: Backward overwrites activations with gradients (ReLU in place, planned
// buffers reused), so a second Backward after one Forward would compute from gradients; it is
// refused as the caller's bug, naming the net, and so is a Backward before any Forward.
TEST(Net, SecondBackwardAfterOneForwardIsRefused) {
  for (const bool plan : {false, true}) {
    SCOPED_TRACE(plan ? "planned memory" : "own storage");
    NetOptions options;
    options.plan_memory = plan;
    Net net(ResidualSpec(4), 3, DType::kF64, options);
    FillInputs(net, 4);
    auto message = [&] {
      try {
        net.Backward();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    const std::string before_forward = message();
    EXPECT_NE(before_forward.find("internal error: net 'residual': Backward without a Forward"),
              std::string::npos)
        << before_forward;
    net.Forward();
    net.Backward();
    const std::string second = message();
    EXPECT_NE(second.find("internal error: net 'residual': Backward without a Forward"),
              std::string::npos)
        << second;
    EXPECT_NE(second.find("each Backward must follow its own Forward"), std::string::npos)
        << second;
    // With a Forward of its own, the next Backward runs and gives the first one's gradients.
    const Tensor first = net.params().front()->grad.Clone();
    net.Forward();
    net.Backward();
    EXPECT_EQ(std::memcmp(first.raw_data(), net.params().front()->grad.raw_data(), first.nbytes()),
              0);
  }
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
