// Layers with a device path of their own (shared kernel bodies) run it on the test device, equal
// to the CPU bit for bit; the others fall back to their CPU kernel inside a test-device kernel.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/graph/layer.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/test_device.h"

namespace cortado {
namespace {

const Device kTest0{DeviceType::kTest, 0};

Tensor Values(const Shape& shape, uint32_t seed) {
  Tensor t(shape, DType::kF32);
  uint32_t s = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    t.data<float>()[i] = static_cast<float>(static_cast<double>(s >> 8) / (1 << 24) - 0.5);
  }
  return t;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct LayerRun {
  std::vector<Tensor> outputs;  // top data, then every input's gradient; host copies
  int64_t fallbacks = 0;        // CPU kernels run on the test device meanwhile
};

// Forward and backward of a `type` layer with `inputs` inputs on `device`.
LayerRun RunLayer(const std::string& type, const Settings& settings, int inputs, Device device) {
  LayerSpec spec{"l", type, {}, {"y"}, settings, ""};
  for (int i = 0; i < inputs; ++i) spec.inputs.push_back("x" + std::to_string(i));
  std::unique_ptr<Layer> layer = LayerRegistry::Create(spec);
  std::vector<Blob> bottom(static_cast<size_t>(inputs));
  std::vector<Blob*> bp;
  for (int i = 0; i < inputs; ++i) {
    bottom[i].name = spec.inputs[i];
    bottom[i].data = Values({2, 3, 4, 5}, 10 + i).To(device);
    bottom[i].grad = Tensor({2, 3, 4, 5}, DType::kF32).To(device);
    bp.push_back(&bottom[i]);
  }
  Blob top{"y", Tensor({0}, DType::kF32).To(device), Tensor()};
  if (device != Device::CPU()) top.data = Tensor({1}, DType::kF32, AllocatorFor(device));
  const int64_t before = TestDeviceHostAliasCalls();
  layer->SetUp(bp, {&top});
  layer->Forward(bp, {&top});
  top.grad = Values(top.data.shape(), 99).To(device);
  layer->Backward({&top}, std::vector<bool>(static_cast<size_t>(inputs), true), bp);
  LayerRun r;
  r.outputs.push_back(top.data.To(Device::CPU()));
  for (Blob& b : bottom) r.outputs.push_back(b.grad.To(Device::CPU()));
  r.fallbacks = TestDeviceHostAliasCalls() - before;
  return r;
}

void ExpectSame(const LayerRun& cpu, const LayerRun& dev) {
  ASSERT_EQ(cpu.outputs.size(), dev.outputs.size());
  for (size_t i = 0; i < cpu.outputs.size(); ++i) {
    EXPECT_TRUE(SameBytes(cpu.outputs[i], dev.outputs[i])) << "output " << i;
  }
}

TEST(DevicePath, ReluAndUnitSumsRunTheirSharedBodiesBitwise) {
  Settings relu;
  Settings sum;
  Settings fused;
  fused.Set("relu", true);
  for (const auto& [type, settings, inputs] :
       {std::tuple{"ReLU", relu, 1}, std::tuple{"Eltwise", sum, 3},
        std::tuple{"Eltwise", fused, 2}}) {
    const LayerRun cpu = RunLayer(type, settings, inputs, Device::CPU());
    const LayerRun dev = RunLayer(type, settings, inputs, kTest0);
    ExpectSame(cpu, dev);
    EXPECT_EQ(dev.fallbacks, 0) << type << ": ran its CPU kernel on the test device";
  }
}

TEST(DevicePath, OtherLayersRunTheirCpuKernelInsideATestDeviceKernel) {
  Settings max_sum;
  max_sum.Set("operation", std::string("max"));
  for (const auto& [type, settings, inputs] : {std::tuple{"Eltwise", max_sum, 2}}) {
    const LayerRun cpu = RunLayer(type, settings, inputs, Device::CPU());
    const LayerRun dev = RunLayer(type, settings, inputs, kTest0);
    ExpectSame(cpu, dev);
    EXPECT_EQ(dev.fallbacks, 2) << type << ": forward and backward, one kernel each";
  }
}

}  // namespace
}  // namespace cortado
