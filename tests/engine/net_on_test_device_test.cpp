// Training on the guarded test device (engine/tensor/test_device.h) against the CPU: the net, the
// solver and the loss scaler allocate on the device, inputs go in by explicit copies, the loss
// and the overflow flag come back by one copy each, and any host access of device memory on the
// way would fault. ReLU and the SGD step and finite check run the shared bodies; the other layers
// run their CPU kernels inside test-device kernels (Layer::CpuKernelOnTestDevice), so the same
// arithmetic runs in the same order and the trajectories must agree bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/base/random.h"
#include "engine/graph/loss_scaler.h"
#include "engine/graph/net.h"
#include "engine/graph/solver.h"
#include "engine/io/checkpoint.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/test_device.h"
#include "models/builders.h"

namespace cortado {
namespace {

const Device kTest0{DeviceType::kTest, 0};

NetSpec Model(const std::string& name, int64_t batch) {
  ModelOptions o;
  o.num_classes = 10;
  o.in_channels = name == "lenet" ? 1 : 3;
  o.height = o.width = name == "lenet" ? 28 : 16;
  o.batch_size = batch;
  return BuildModel(name, o);
}

// Copies batch `step` (images in [-1, 1), labels below 10) into the net's inputs: built on the
// host in the input's format and dtype, then one explicit copy each onto the net's device.
void Feed(Net& net, int step) {
  Rng rng(100 + static_cast<uint64_t>(step));
  Tensor& data = net.input("data");
  Tensor images(data.shape(), DType::kF64);
  for (int64_t i = 0; i < images.numel(); ++i) images.data<double>()[i] = rng.Uniform(-1, 1);
  Tensor typed(data.shape(), data.dtype());
  typed.ConvertFrom(images);
  Tensor formatted(data.shape(), data.dtype());
  if (data.ndim() == 4) formatted.set_format(data.format());
  formatted.ReorderFrom(typed);
  data.CopyFrom(formatted.To(data.device()));
  Tensor& label = net.input("label");
  Tensor labels(label.shape(), DType::kI32);
  for (int64_t i = 0; i < labels.numel(); ++i) {
    labels.data<int32_t>()[i] = static_cast<int32_t>(rng.Below(10));
  }
  label.CopyFrom(labels.To(label.device()));
}

struct TrainRun {
  std::vector<double> losses;
  Checkpoint state;  // the net's and the solver's, host copies
  int64_t skipped = 0;
};

struct TrainSetup {
  std::string model = "lenet";
  MemoryFormat layout = MemoryFormat::kNCHW;
  DType dtype = DType::kF32;
  bool plan_memory = false;
  bool fuse = false;
  double init_scale = 0;  // > 0: a dynamic loss scale starting there
};

TrainRun Train(const TrainSetup& s, Device device, int steps) {
  NetOptions options;
  options.layout = s.layout;
  options.plan_memory = s.plan_memory;
  options.fuse = s.fuse;
  options.device = device;
  Net net(Model(s.model, 6), 1, s.dtype, options);
  for (Param* p : net.params()) EXPECT_EQ(p->value.device(), device) << p->name;
  SgdOptions sgd;
  sgd.weight_decay = 5e-4;
  SgdSolver solver(net.params(), sgd);
  LossScalerOptions so;
  so.init_scale = s.init_scale > 0 ? s.init_scale : 1;
  so.growth_interval = 3;
  LossScaler scaler(so);
  TrainRun r;
  for (int step = 0; step < steps; ++step) {
    Feed(net, step);
    r.losses.push_back(net.Forward());
    if (s.init_scale > 0) {
      net.Backward(scaler.scale());
      const bool finite = LossScaler::AllFinite(net.params());
      if (finite) solver.Step(0.05, 1.0 / scaler.scale());
      scaler.Update(finite);
    } else {
      net.Backward();
      solver.Step(0.05);
    }
  }
  r.skipped = scaler.skipped_steps();
  net.SaveState(r.state);
  solver.SaveState(r.state);
  return r;
}

void ExpectSameState(const Checkpoint& a, const Checkpoint& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [name, t] = a.tensors[i];
    const auto& [other_name, u] = b.tensors[i];
    ASSERT_EQ(name, other_name);
    EXPECT_EQ(t.device(), Device::CPU()) << name;  // checkpoints hold host copies
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()), 0) << name << " differs";
  }
}

void ExpectSameTrajectory(const TrainSetup& s, int steps) {
  const TrainRun cpu = Train(s, Device::CPU(), steps);
  const TrainRun dev = Train(s, kTest0, steps);
  ASSERT_EQ(cpu.losses.size(), dev.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_EQ(cpu.losses[i], dev.losses[i]) << "step " << i;  // bitwise
  }
  EXPECT_EQ(cpu.skipped, dev.skipped);
  ExpectSameState(cpu.state, dev.state);
  // It trained: the loss moved.
  EXPECT_NE(cpu.losses.front(), cpu.losses.back());
}

TEST(NetOnTestDevice, LeNetThirtyStepsEqualTheCpuBitwiseNCHW) {
  ExpectSameTrajectory(TrainSetup{"lenet", MemoryFormat::kNCHW}, 30);
}

TEST(NetOnTestDevice, LeNetThirtyStepsEqualTheCpuBitwiseNHWC) {
  ExpectSameTrajectory(TrainSetup{"lenet", MemoryFormat::kNHWC}, 30);
}

TEST(NetOnTestDevice, LeNetWithAMemoryPlanEqualsTheCpuBitwise) {
  TrainSetup s{"lenet", MemoryFormat::kNHWC};
  s.plan_memory = true;
  ExpectSameTrajectory(s, 10);
}

TEST(NetOnTestDevice, ResNet20ThirtyStepsEqualTheCpuBitwise) {
  ExpectSameTrajectory(TrainSetup{"resnet20", MemoryFormat::kNHWC}, 30);
}

TEST(NetOnTestDevice, ResNet20FusedWithAMemoryPlanEqualsTheCpuBitwise) {
  // Batch norm and the residual sums take their ReLUs (the sum's fused ReLU on the device's
  // shared bodies), and the activations share one planned arena on the device.
  TrainSetup s{"resnet20", MemoryFormat::kNHWC};
  s.fuse = true;
  s.plan_memory = true;
  ExpectSameTrajectory(s, 10);
}

TEST(NetOnTestDevice, Fp16OverflowStepsAreSkippedAsOnTheCpu) {
  // 2^24 times an f16 loss gradient overflows f16 at once; the scale backs off until the
  // gradients are finite, then grows every 3 clean steps and overflows again.
  TrainSetup s{"lenet", MemoryFormat::kNHWC, DType::kF16};
  s.init_scale = 16777216.0;
  const TrainRun cpu = Train(s, Device::CPU(), 30);
  const TrainRun dev = Train(s, kTest0, 30);
  EXPECT_GT(cpu.skipped, 0);
  EXPECT_EQ(cpu.skipped, dev.skipped);
  EXPECT_EQ(cpu.losses, dev.losses);
  ExpectSameState(cpu.state, dev.state);
}

TEST(NetOnTestDevice, ACheckpointMovesBetweenTheCpuAndTheDeviceBitwise) {
  const TrainSetup s{"lenet", MemoryFormat::kNHWC};
  const TrainRun trained = Train(s, kTest0, 3);  // saved from the device
  for (Device to : {Device::CPU(), kTest0}) {
    NetOptions options;
    options.layout = s.layout;
    options.device = to;
    Net net(Model("lenet", 6), 7, DType::kF32, options);  // another seed: other weights
    net.LoadState(trained.state, "trained");
    for (Param* p : net.params()) EXPECT_EQ(p->value.device(), to);
    Checkpoint again;
    net.SaveState(again);
    Checkpoint net_part;
    for (const auto& [name, t] : trained.state.tensors) {
      if (Net::IsNetState(name)) net_part.Add(name, t);
    }
    ExpectSameState(net_part, again);
  }
}

TEST(NetOnTestDevice, DeviceMemoryStaysGuardedBetweenSteps) {
  NetOptions options;
  options.device = kTest0;
  Net net(Model("lenet", 2), 1, DType::kF32, options);
  Feed(net, 0);
  net.Forward();
  for (Param* p : net.params()) {
    EXPECT_TRUE(TestDeviceMemoryGuarded(p->value.raw_data())) << p->name;
    EXPECT_THROW(p->value.data<float>(), Error);
  }
  EXPECT_TRUE(TestDeviceMemoryGuarded(net.input("data").raw_data()));
}

}  // namespace
}  // namespace cortado
