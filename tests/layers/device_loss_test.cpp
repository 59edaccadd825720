// SoftmaxWithLoss, Accuracy and Dropout on the test device run their own shared bodies
// (layers/loss_kernels.h, layers/dropout_kernels.h), not the CPU kernel on host views, and equal
// the CPU bit for bit, forward and backward, in f32 and f64, and in bf16 and f16 (computed in
// f32 on the device as on the CPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/graph/layer.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/test_device.h"

namespace cortado {
namespace {

const Device kTest0{DeviceType::kTest, 0};

// Values in [-2, 2) of `dtype`; with `step` > 0 rounded to multiples of it (ties between classes).
Tensor Values(const Shape& shape, DType dtype, uint32_t seed, double step = 0) {
  Tensor f64(shape, DType::kF64);
  uint32_t s = seed;
  for (int64_t i = 0; i < f64.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    double v = static_cast<double>(s >> 8) / (1 << 22) - 2.0;
    if (step > 0) v = std::floor(v / step) * step;
    f64.data<double>()[i] = v;
  }
  Tensor t(shape, dtype);
  t.ConvertFrom(f64);
  return t;
}

Tensor Labels(const std::vector<int32_t>& values) {
  Tensor t({static_cast<int64_t>(values.size())}, DType::kI32);
  std::memcpy(t.data<int32_t>(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// A host copy that later steps do not overwrite (To(CPU) of a CPU tensor is the tensor itself).
Tensor HostCopy(const Tensor& t) {
  return t.device() == Device::CPU() ? t.Clone() : t.To(Device::CPU());
}

struct LayerRun {
  std::vector<Tensor> outputs;  // per step: top data, then input 0's gradient; host copies
  int64_t fallbacks = 0;        // CPU kernels run on the test device meanwhile
};

struct Step {
  Phase phase = Phase::kTrain;
  int64_t iteration = 0;
};

// Forward (and, with `backward`, backward into input 0) of a `type` layer on `inputs` (host
// tensors, copied to `device`) for each step; the top's gradient is `top_grad` (or made of
// values where the top is not a scalar).
LayerRun RunLayer(const std::string& type, const Settings& settings,
                  const std::vector<Tensor>& inputs, Device device, const std::vector<Step>& steps,
                  bool backward, double top_grad = 0.75, LayerContext context = {}) {
  LayerSpec spec{"drop", type, {}, {"y"}, settings, ""};
  std::vector<Blob> bottom(inputs.size());
  std::vector<Blob*> bp;
  for (size_t i = 0; i < inputs.size(); ++i) {
    spec.inputs.push_back("x" + std::to_string(i));
    bottom[i].name = spec.inputs[i];
    bottom[i].data = inputs[i].To(device);
    if (i == 0) bottom[i].grad = Tensor(inputs[i].shape(), inputs[i].dtype()).To(device);
    bp.push_back(&bottom[i]);
  }
  bottom[0].grad.set_format(inputs[0].format());
  std::unique_ptr<Layer> layer = LayerRegistry::Create(spec);
  context.seed = 1234;
  layer->set_context(&context);
  Blob top{"y", Tensor({1}, inputs[0].dtype(), AllocatorFor(device)), Tensor()};
  const int64_t before = TestDeviceHostAliasCalls();
  layer->SetUp(bp, {&top});
  LayerRun r;
  std::vector<bool> down(inputs.size(), false);
  down[0] = true;
  for (const Step& step : steps) {
    context.phase = step.phase;
    context.iteration = step.iteration;
    layer->Reshape(bp, {&top});
    layer->Forward(bp, {&top});
    r.outputs.push_back(HostCopy(top.data));
    if (!backward) continue;
    if (top.data.ndim() == 0) {
      Tensor g({}, top.data.dtype());
      g.Fill(top_grad);
      top.grad = g.To(device);
    } else {
      top.grad =
          Values(top.data.shape(), top.data.dtype(), 99 + static_cast<uint32_t>(step.iteration))
              .To(device);
      top.grad.set_format(top.data.format());
    }
    layer->Backward({&top}, down, bp);
    r.outputs.push_back(HostCopy(bottom[0].grad));
  }
  r.fallbacks = TestDeviceHostAliasCalls() - before;
  return r;
}

void ExpectSame(const LayerRun& cpu, const LayerRun& dev, const std::string& what) {
  ASSERT_EQ(cpu.outputs.size(), dev.outputs.size()) << what;
  for (size_t i = 0; i < cpu.outputs.size(); ++i) {
    EXPECT_TRUE(SameBytes(cpu.outputs[i], dev.outputs[i])) << what << ": output " << i;
  }
}

const std::vector<Step> kOneStep = {Step{}};

TEST(DeviceLoss, SoftmaxWithLossIsTheCpusBitwiseWithAndWithoutSmoothing) {
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (double smoothing : {0.0, 0.1}) {
      Settings settings;
      settings.Set("label_smoothing", smoothing);
      // 7 samples of 10 classes, logits as (N, C, 1, 1), labels at both ends of the range.
      const std::vector<Tensor> inputs = {Values({7, 10, 1, 1}, dtype, 3),
                                          Labels({0, 9, 3, 3, 7, 1, 9})};
      const LayerRun cpu =
          RunLayer("SoftmaxWithLoss", settings, inputs, Device::CPU(), kOneStep, true);
      const LayerRun dev = RunLayer("SoftmaxWithLoss", settings, inputs, kTest0, kOneStep, true);
      const std::string what =
          std::string(DTypeName(dtype)) + " smoothing " + std::to_string(smoothing);
      ExpectSame(cpu, dev, what);
      EXPECT_EQ(dev.fallbacks, 0) << what << ": ran its CPU kernel on the test device";
      EXPECT_GT(ElementAsDouble(dev.outputs[0], 0), 0.0) << what;
    }
  }
}

TEST(DeviceLoss, SoftmaxWithLossOfALabelOutOfRangeIsNaNOnADevice) {
  // The CPU throws; a device kernel cannot, so the loss says it.
  const std::vector<Tensor> inputs = {Values({3, 4}, DType::kF32, 5), Labels({1, 4, 0})};
  EXPECT_THROW(RunLayer("SoftmaxWithLoss", Settings{}, inputs, Device::CPU(), kOneStep, false),
               Error);
  const LayerRun dev = RunLayer("SoftmaxWithLoss", Settings{}, inputs, kTest0, kOneStep, true);
  EXPECT_TRUE(std::isnan(ElementAsDouble(dev.outputs[0], 0)));
  EXPECT_EQ(dev.fallbacks, 0);
}

TEST(DeviceLoss, AccuracyTopOneAndTopFiveWithTiesIsTheCpusBitwise) {
  for (DType dtype : {DType::kF32, DType::kF64}) {
    // Scores on a coarse grid: many classes tie with the label's score; sample 4's label
    // scores NaN (never correct).
    Tensor grid = Values({7, 10}, DType::kF64, 11, 0.5);
    grid.data<double>()[4 * 10 + 5] = std::nan("");
    Tensor scores(grid.shape(), dtype);
    scores.ConvertFrom(grid);
    const std::vector<Tensor> inputs = {scores, Labels({2, 0, 9, 5, 5, 1, 8})};
    for (int64_t top_k : {1, 5}) {
      Settings settings;
      settings.Set("top_k", top_k);
      const LayerRun cpu = RunLayer("Accuracy", settings, inputs, Device::CPU(), kOneStep, false);
      const LayerRun dev = RunLayer("Accuracy", settings, inputs, kTest0, kOneStep, false);
      const std::string what = std::string(DTypeName(dtype)) + " top " + std::to_string(top_k);
      ExpectSame(cpu, dev, what);
      EXPECT_EQ(dev.fallbacks, 0) << what;
      const double accuracy = ElementAsDouble(dev.outputs[0], 0);
      EXPECT_GT(accuracy, 0.0) << what;
      EXPECT_LT(accuracy, 1.0) << what;
    }
  }
}

TEST(DeviceLoss, DropoutMasksAndGradientsAreTheCpusBitwiseOverStepsAndPhases) {
  const std::vector<Step> steps = {Step{Phase::kTrain, 0}, Step{Phase::kTrain, 1},
                                   Step{Phase::kTest, 2}};
  Settings settings;
  settings.Set("ratio", 0.3);
  for (DType dtype : {DType::kF32, DType::kF64}) {
    Tensor nhwc = Values({2, 3, 5, 7}, dtype, 21);
    Tensor reordered(nhwc.shape(), dtype);
    reordered.set_format(MemoryFormat::kNHWC);
    reordered.ReorderFrom(nhwc);
    LayerContext ranks;  // rank 1 of 2: its samples are global samples 1 and 3
    ranks.sample_base = 1;
    ranks.sample_stride = 2;
    for (const auto& [input, context] :
         {std::pair{Values({3, 7, 5}, dtype, 17), LayerContext{}}, std::pair{reordered, ranks}}) {
      const LayerRun cpu =
          RunLayer("Dropout", settings, {input}, Device::CPU(), steps, true, 0, context);
      const LayerRun dev = RunLayer("Dropout", settings, {input}, kTest0, steps, true, 0, context);
      const std::string what = std::string(DTypeName(dtype)) + " " + input.ToString();
      ExpectSame(cpu, dev, what);
      EXPECT_EQ(dev.fallbacks, 0) << what;
      // Two training steps draw two masks; inference passes the input through.
      EXPECT_FALSE(SameBytes(dev.outputs[0], dev.outputs[2])) << what;
      EXPECT_TRUE(SameBytes(dev.outputs[4], input)) << what;
    }
  }
}

TEST(DeviceLoss, SixteenBitInputsComputeInF32OnTheDeviceAsOnTheCpu) {
  const std::vector<Step> steps = {Step{Phase::kTrain, 0}, Step{Phase::kTest, 1}};
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const std::string name = DTypeName(dtype);
    Settings smoothing;
    smoothing.Set("label_smoothing", 0.1);
    const std::vector<Tensor> logits = {Values({7, 10}, dtype, 3), Labels({0, 9, 3, 3, 7, 1, 9})};
    const LayerRun cpu =
        RunLayer("SoftmaxWithLoss", smoothing, logits, Device::CPU(), kOneStep, true);
    const LayerRun dev = RunLayer("SoftmaxWithLoss", smoothing, logits, kTest0, kOneStep, true);
    ExpectSame(cpu, dev, name + " SoftmaxWithLoss");
    EXPECT_EQ(dev.fallbacks, 0) << name;
    Settings top5;
    top5.Set("top_k", 5);
    const std::vector<Tensor> scores = {Values({7, 10}, dtype, 11, 0.5),
                                        Labels({2, 0, 9, 5, 5, 1, 8})};
    const LayerRun cpu_acc = RunLayer("Accuracy", top5, scores, Device::CPU(), kOneStep, false);
    const LayerRun dev_acc = RunLayer("Accuracy", top5, scores, kTest0, kOneStep, false);
    ExpectSame(cpu_acc, dev_acc, name + " Accuracy");
    EXPECT_EQ(dev_acc.fallbacks, 0) << name;
    Settings ratio;
    ratio.Set("ratio", 0.3);
    const std::vector<Tensor> x = {Values({3, 7, 5}, dtype, 17)};
    const LayerRun cpu_drop = RunLayer("Dropout", ratio, x, Device::CPU(), steps, true, 0);
    const LayerRun dev_drop = RunLayer("Dropout", ratio, x, kTest0, steps, true, 0);
    ExpectSame(cpu_drop, dev_drop, name + " Dropout");
    EXPECT_EQ(dev_drop.fallbacks, 0) << name;
  }
}

}  // namespace
}  // namespace cortado
