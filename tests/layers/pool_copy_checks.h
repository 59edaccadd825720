// Pooling, Concat, Split, Flatten and Reshape on a device (the guarded test device in
// tests/layers/device_pool_copy_test.cpp, a GPU in tests/cuda/pool_copy_on_gpu_test.cpp) against
// the CPU kernels: forward and every input gradient bit for bit, on odd shapes, in NCHW and NHWC,
// in f32, f64, bf16 and f16, through the layers' own device paths (the shared bodies of
// layers/pooling_kernels.h and layers/copy_kernels.h, no CPU kernel on host views:
// TestDeviceHostAliasCalls stays put). Header-only; each Check* is the body of one test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/random.h"
#include "engine/graph/layer.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/test_device.h"

namespace cortado::testing::pool_copy {

inline const DType kFloatTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};

// A host tensor of `dtype` in `format`. With `ties`, values on a coarse grid (k / 8, exact in
// every dtype), so pooling windows hold equal maxima; else N(0, 1) values, rounded to dtype.
inline Tensor Values(const Shape& shape, DType dtype, MemoryFormat format, uint64_t seed,
                     bool ties) {
  Tensor wide(shape, DType::kF64);
  Rng rng(seed);
  for (int64_t i = 0; i < wide.numel(); ++i) {
    wide.data<double>()[i] =
        ties ? (static_cast<double>(rng.Below(24)) - 12.0) / 8.0 : rng.Normal(0.0, 1.0);
  }
  Tensor typed(shape, dtype);
  typed.ConvertFrom(wide);
  if (format == MemoryFormat::kNHWC) typed.set_format(format);  // values in memory order
  return typed;
}

inline bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct LayerRun {
  std::vector<Tensor> outputs;  // every top's data, then every input's gradient; host copies
  int64_t fallbacks = 0;        // CPU kernels run on the test device meanwhile
};

// Forward and backward of a `type` layer with `num_tops` outputs on `device`; top gradients are
// N(0, 1) values in the tops' dtype and format.
inline LayerRun RunLayer(const std::string& type, const Settings& settings,
                         const std::vector<Tensor>& inputs, int num_tops, Device device) {
  LayerSpec spec{"l", type, {}, {}, settings, ""};
  std::vector<Blob> bottom(inputs.size()), top(static_cast<size_t>(num_tops));
  std::vector<Blob*> bp, tp;
  const std::shared_ptr<Allocator>& alloc = AllocatorFor(device);
  for (size_t i = 0; i < inputs.size(); ++i) {
    bottom[i].name = "x" + std::to_string(i);
    spec.inputs.push_back(bottom[i].name);
    bottom[i].data = inputs[i].To(device);
    bp.push_back(&bottom[i]);
  }
  for (int j = 0; j < num_tops; ++j) {
    top[j].name = "y" + std::to_string(j);
    spec.outputs.push_back(top[j].name);
    top[j].data = Tensor({1}, inputs[0].dtype(), alloc);
    tp.push_back(&top[j]);
  }
  std::unique_ptr<Layer> layer = LayerRegistry::Create(spec);
  const int64_t before = TestDeviceHostAliasCalls();
  layer->SetUp(bp, tp);
  layer->Reshape(bp, tp);
  layer->Forward(bp, tp);
  std::vector<bool> propagate;
  for (Blob& b : bottom) {
    // NaN first, so that an element the backward does not write shows.
    b.grad = Tensor(b.data.shape(), b.data.dtype(), alloc);
    if (b.data.ndim() == 4) b.grad.set_format(b.data.format());
    b.grad.Fill(std::nan(""));
    propagate.push_back(true);
  }
  for (int j = 0; j < num_tops; ++j) {
    top[j].grad = Values(top[j].data.shape(), top[j].data.dtype(), top[j].data.format(),
                         200 + static_cast<uint64_t>(j), false)
                      .To(device);
  }
  layer->Backward(tp, propagate, bp);
  LayerRun r;
  for (Blob& t : top) r.outputs.push_back(t.data.To(Device::CPU()));
  for (Blob& b : bottom) r.outputs.push_back(b.grad.To(Device::CPU()));
  r.fallbacks = TestDeviceHostAliasCalls() - before;
  return r;
}

// The layer on `device` equals the CPU bit for bit, through its own device path (no CPU kernel
// on the test device).
inline void ExpectDeviceEqualsCpu(Device device, const std::string& type, const Settings& settings,
                                  const std::vector<Tensor>& inputs, int num_tops,
                                  const std::string& what) {
  const LayerRun cpu = RunLayer(type, settings, inputs, num_tops, Device::CPU());
  const LayerRun dev = RunLayer(type, settings, inputs, num_tops, device);
  ASSERT_EQ(cpu.outputs.size(), dev.outputs.size());
  for (size_t i = 0; i < cpu.outputs.size(); ++i) {
    EXPECT_TRUE(SameBytes(cpu.outputs[i], dev.outputs[i]))
        << what << ": output " << i << " (" << cpu.outputs[i].ToString() << ")";
  }
  EXPECT_EQ(dev.fallbacks, 0) << what << ": ran its CPU kernel on the test device";
}

inline std::string Name(DType dtype, MemoryFormat format) {
  return std::string(DTypeName(dtype)) + " " + MemoryFormatName(format);
}

struct PoolCase {
  const char* pool;
  int64_t kernel_h, kernel_w, stride, pad;
  bool ceil, include_pad, global;
};

inline Settings PoolSettings(const PoolCase& p) {
  Settings s;
  s.Set("pool", p.pool);
  if (p.global) {
    s.Set("global", true);
    return s;
  }
  s.SetInts("kernel", {p.kernel_h, p.kernel_w}).Set("stride", p.stride).Set("pad", p.pad);
  s.Set("ceil_mode", p.ceil).Set("count_include_pad", p.include_pad);
  return s;
}

inline void CheckPooling(Device device) {
  const PoolCase cases[] = {
      {"max", 3, 3, 2, 1, false, true, false}, {"max", 3, 3, 2, 1, true, true, false},
      {"max", 2, 2, 2, 0, false, true, false},  // the CPU's 2x2 fast path
      {"max", 2, 3, 3, 1, true, true, false},   // a rectangle, stride > kernel: gaps
      {"ave", 3, 3, 2, 1, true, true, false},  {"ave", 3, 3, 1, 1, false, false, false},
      {"ave", 2, 3, 3, 1, true, false, false}, {"max", 0, 0, 0, 0, false, true, true},
      {"ave", 0, 0, 0, 0, false, true, true},
  };
  for (DType dtype : kFloatTypes) {
    for (MemoryFormat format : {MemoryFormat::kNCHW, MemoryFormat::kNHWC}) {
      for (const PoolCase& p : cases) {
        const Tensor x = Values({2, 3, 7, 5}, dtype, format, 11, /*ties=*/true);
        ExpectDeviceEqualsCpu(device, "Pooling", PoolSettings(p), {x}, 1,
                              Name(dtype, format) + " " + p.pool + " kernel " +
                                  std::to_string(p.kernel_h) + "x" + std::to_string(p.kernel_w) +
                                  (p.ceil ? " ceil" : "") + (p.global ? " global" : ""));
      }
    }
  }
}

// An inference net's max pooling layers share one argmax buffer (ScratchSpace::ForwardOnly); on
// a device it is allocated there, and grows there for a larger layer.
inline void CheckPoolingWithSharedScratch(Device device) {
  Settings s = PoolSettings({"max", 3, 3, 2, 1, true, true, false});
  const auto run = [&](Device on, ScratchSpace& scratch) {
    LayerContext context;
    context.phase = Phase::kTest;
    context.inference = true;
    context.scratch = &scratch;
    std::vector<Tensor> outputs;
    for (int64_t size : {5, 9}) {  // the second layer's argmax is larger
      const std::string name = "pool" + std::to_string(size);
      std::unique_ptr<Layer> layer =
          LayerRegistry::Create(LayerSpec{name, "Pooling", {"x"}, {"y"}, s, ""});
      layer->set_context(&context);
      Blob x{"x", Values({2, 3, size, 7}, DType::kF32, MemoryFormat::kNCHW, 60, true).To(on),
             Tensor()};
      Blob y{"y", Tensor({1}, DType::kF32, AllocatorFor(on)), Tensor()};
      layer->SetUp({&x}, {&y});
      layer->Forward({&x}, {&y});
      outputs.push_back(y.data.To(Device::CPU()));
    }
    EXPECT_EQ(scratch.ForwardOnly().device(), on);
    return outputs;
  };
  ScratchSpace cpu_scratch, dev_scratch;
  const std::vector<Tensor> cpu = run(Device::CPU(), cpu_scratch);
  const int64_t before = TestDeviceHostAliasCalls();
  const std::vector<Tensor> dev = run(device, dev_scratch);
  EXPECT_EQ(TestDeviceHostAliasCalls(), before);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(SameBytes(cpu[i], dev[i])) << i;
}

// A NaN always wins a max window (PyTorch's rule), on the device as on the CPU.
inline void CheckMaxPoolingNaN(Device device) {
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (MemoryFormat format : {MemoryFormat::kNCHW, MemoryFormat::kNHWC}) {
      Tensor x = Values({2, 3, 7, 5}, dtype, format, 12, /*ties=*/true);
      for (int64_t i : {0, 17, 18, 64, 200}) {
        if (dtype == DType::kF32) {
          x.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
        } else {
          x.data<double>()[i] = std::numeric_limits<double>::quiet_NaN();
        }
      }
      for (const PoolCase& p : {PoolCase{"max", 3, 3, 2, 1, true, true, false},
                                PoolCase{"max", 2, 2, 2, 0, false, true, false}}) {
        ExpectDeviceEqualsCpu(device, "Pooling", PoolSettings(p), {x}, 1,
                              Name(dtype, format) + " NaN");
      }
    }
  }
}

inline void CheckConcat(Device device) {
  for (DType dtype : kFloatTypes) {
    for (MemoryFormat format : {MemoryFormat::kNCHW, MemoryFormat::kNHWC}) {
      for (int64_t axis : {1, 2, 0, 3}) {
        std::vector<Tensor> inputs;
        const int64_t sizes[] = {2, 1, 4};  // three inputs, different lengths along the axis
        for (int i = 0; i < 3; ++i) {
          Shape shape{2, 3, 7, 5};
          shape[static_cast<size_t>(axis)] = sizes[i];
          inputs.push_back(Values(shape, dtype, format, 30 + static_cast<uint64_t>(i), false));
        }
        Settings s;
        s.Set("axis", axis);
        ExpectDeviceEqualsCpu(device, "Concat", s, inputs, 1,
                              Name(dtype, format) + " axis " + std::to_string(axis));
      }
    }
  }
}

// Concat moves bytes of any dtype: u8 takes one-byte units on the device (forward only: integer
// inputs take no gradient).
inline void CheckConcatOfBytes(Device device) {
  std::vector<Tensor> inputs;
  for (int64_t c : {3, 1}) {
    Tensor t({2, c, 3, 3}, DType::kU8);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7 + c);
    inputs.push_back(t);
  }
  Settings s;
  const auto run = [&](Device on) {
    LayerSpec spec{"l", "Concat", {"x0", "x1"}, {"y"}, s, ""};
    std::unique_ptr<Layer> layer = LayerRegistry::Create(spec);
    Blob b0{"x0", inputs[0].To(on), Tensor()}, b1{"x1", inputs[1].To(on), Tensor()};
    Blob top{"y", Tensor({1}, DType::kU8, AllocatorFor(on)), Tensor()};
    layer->SetUp({&b0, &b1}, {&top});
    layer->Forward({&b0, &b1}, {&top});
    return top.data.To(Device::CPU());
  };
  const int64_t before = TestDeviceHostAliasCalls();
  EXPECT_TRUE(SameBytes(run(Device::CPU()), run(device)));
  EXPECT_EQ(TestDeviceHostAliasCalls(), before);
}

inline void CheckSplit(Device device) {
  for (DType dtype : kFloatTypes) {
    for (MemoryFormat format : {MemoryFormat::kNCHW, MemoryFormat::kNHWC}) {
      // One top is a copy; 3 one pass; 11 three passes (8 tops each at most).
      for (int tops : {1, 3, 11}) {
        const Tensor x = Values({2, 3, 7, 5}, dtype, format, 40, false);
        ExpectDeviceEqualsCpu(device, "Split", Settings(), {x}, tops,
                              Name(dtype, format) + " " + std::to_string(tops) + " tops");
      }
    }
  }
}

inline void CheckFlattenAndReshape(Device device) {
  Settings flatten;
  flatten.Set("axis", 1);
  Settings reshape;
  reshape.SetInts("shape", {0, -1, 5});
  for (DType dtype : kFloatTypes) {
    const Tensor x = Values({2, 3, 7, 5}, dtype, MemoryFormat::kNCHW, 50, false);
    ExpectDeviceEqualsCpu(device, "Flatten", flatten, {x}, 1,
                          std::string(DTypeName(dtype)) + " flatten");
    ExpectDeviceEqualsCpu(device, "Reshape", reshape, {x}, 1,
                          std::string(DTypeName(dtype)) + " reshape");
  }
}

}  // namespace cortado::testing::pool_copy
