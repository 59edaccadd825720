// The convolution and inner product layers' own device path (the guarded test device in
// tests/layers/device_conv_test.cpp: the reference bodies of layers/conv_kernels.h and
// layers/matmul_kernels.h; a GPU in tests/cuda/conv_on_gpu_test.cpp: cuDNN and cuBLASLt; through
// the same plumbing: formats, the OHWI filter copy, groups, dilation, bias) against the CPU layer,
// with no CPU-kernel fallback on the way (TestDeviceHostAliasCalls stays put). Header-only; each
// Check* is the body of one test.
//
// The bound. Each output is a sum of `terms` products (plus the bias), which the CPU (im2col +
// GEMM, per-thread partials; oneDNN for channels-last f32) and the device bodies (one ordered sum
// per element) add in different orders. Any order of summing n terms in floating point is within
// gamma_n * sum |term| of the exact sum, gamma_n = n u / (1 - n u), u = eps / 2 (Higham, Accuracy
// and Stability of Numerical Algorithms, 4.2; fused multiply-adds only remove roundings), so the
// two results differ by at most 2 gamma_n sum |term|, about n eps sum |term|. The test allows
// 2 n eps sum |term|: twice that, for the rounding of sum |term| itself, which it gets by running
// the CPU layer on |x|, |w|, |b| and |dy| (every pass is bilinear, so that run's outputs are the
// sums of the absolute terms). A wrong index or a missed term is off by about sum |term| / n,
// far outside.
//
// bf16 and f16 (the CPU's mixed precision: 16-bit activations and a 16-bit copy of the f32
// weights, whose products are exact in f32, summed in f32): the sums differ as f32 sums do, by
// 2 n eps_f32 sum |term|, and a 16-bit output is then rounded once on each side, each within
// eps_16 / 2 of its sum, so they differ by at most 2 (n eps_f32 + eps_16 / 2) sum |term|; the test
// allows 2 (n eps_f32 + eps_16) sum |term| (the weight and bias gradients stay f32: 2 n eps_f32).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/error.h"
#include "engine/graph/layer.h"
#include "engine/tensor/device_runtime.h"
#include "engine/tensor/test_device.h"

namespace cortado::testing::conv_device {

// Values in [-1, 1) from `seed`, in memory order, on the host; |values| when `abs`.
inline Tensor Values(const Shape& shape, DType dtype, MemoryFormat format, uint32_t seed,
                     bool abs) {
  Tensor wide(shape, DType::kF64);
  uint32_t s = seed;
  for (int64_t i = 0; i < wide.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    const double v = static_cast<double>(s >> 8) / (1 << 23) - 1.0;
    wide.data<double>()[i] = abs ? std::fabs(v) : v;
  }
  Tensor t(shape, dtype);
  t.ConvertFrom(wide);
  if (shape.size() == 4) t.set_format(format);
  return t;
}

// Every element of a host float tensor as double, in memory order.
inline std::vector<double> Elements(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = ElementAsDouble(t, i);
  return v;
}

// A host copy of its own (To(cpu) of a host tensor is the tensor itself).
inline Tensor HostCopy(const Tensor& t) { return t.To(Device::CPU()).Clone(); }

// What one run gives back: host copies of each output, and how many terms each output's sums have.
struct Outputs {
  std::vector<std::string> names;
  std::vector<Tensor> tensors;
  std::vector<int64_t> terms;
  int64_t fallbacks = 0;  // CPU kernels run on the test device meanwhile
};

struct Case {
  std::string type;  // Convolution or InnerProduct
  Settings settings;
  Shape input;
  MemoryFormat format = MemoryFormat::kNCHW;
  std::string label;
};

// Two training steps of the layer on `device` (forward, then backward with the parameters'
// gradients first filled with garbage, which they must overwrite), the weights replaced between
// them (as a solver's update does, so a kept OHWI copy must follow). On the test device the
// parameters are moved there as a Net does. `abs`: every value and weight by its magnitude.
inline Outputs RunSteps(const Case& c, DType dtype, Device device, bool abs,
                        bool propagate = true) {
  LayerSpec spec{"l", c.type, {"x"}, {"y"}, c.settings, ""};
  std::unique_ptr<Layer> layer = LayerRegistry::Create(spec);
  const std::shared_ptr<Allocator>& on = AllocatorFor(device);
  Blob bottom{"x", Values(c.input, dtype, c.format, 1, abs).To(device), Tensor(c.input, dtype, on)};
  if (c.input.size() == 4) bottom.grad.set_format(c.format);
  Blob top{"y", Tensor({1}, dtype, on), Tensor()};
  const int64_t before = TestDeviceHostAliasCalls();
  layer->SetUp({&bottom}, {&top});
  for (Param& p : layer->params()) {
    // (16-bit activations keep f32 master parameters.)
    if (abs)
      p.value.CopyFrom(Values(p.value.shape(), p.value.dtype(), MemoryFormat::kNCHW, 5, true));
    p.value = p.value.To(device);
    p.grad = p.grad.To(device);
  }
  Outputs out;
  for (int step = 0; step < 2; ++step) {
    if (step == 1) {
      Param& w = layer->params()[0];
      w.value.CopyFrom(
          Values(w.value.shape(), w.value.dtype(), MemoryFormat::kNCHW, 7, abs).To(device));
    }
    layer->Forward({&bottom}, {&top});
    top.grad = Values(top.data.shape(), dtype, top.data.format(), 11 + step, abs).To(device);
    for (Param& p : layer->params()) p.grad.Fill(1000.0);
    bottom.grad.Fill(-7.0);
    layer->Backward({&top}, {propagate}, {&bottom});
    const std::string at = " (step " + std::to_string(step) + ")";
    out.names.push_back("y" + at);
    out.tensors.push_back(HostCopy(top.data));
    out.names.push_back("dx" + at);
    out.tensors.push_back(HostCopy(bottom.grad));
    for (const Param& p : layer->params()) {
      out.names.push_back(p.name + " gradient" + at);
      out.tensors.push_back(HostCopy(p.grad));
    }
  }
  out.fallbacks = TestDeviceHostAliasCalls() - before;
  // Terms per sum: y: C/g kh kw products and the bias; dx: K/g kh kw; dW and db: N oh ow. The
  // inner product: y: K_in and the bias; dx: K_out; dW and db: N.
  const Tensor& y = top.data;
  const Shape& ws = layer->params()[0].value.shape();
  std::vector<int64_t> terms;
  if (c.type == "Convolution") {
    const int64_t groups = c.settings.GetInt("groups", 1);
    const int64_t per_position = y.dim(0) * y.dim(2) * y.dim(3);
    terms = {ws[1] * ws[2] * ws[3] + 1, ws[0] / groups * ws[2] * ws[3], per_position, per_position};
  } else {
    terms = {ws[1] + 1, ws[0], c.input[0], c.input[0]};
  }
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < 2 + layer->params().size(); ++i) out.terms.push_back(terms[i]);
  }
  return out;
}

// The device's outputs equal the CPU's within factor * 2 n eps sum |term| (see the top).
inline void ExpectWithinTheBound(const Case& c, DType dtype, Device device, double factor) {
  SCOPED_TRACE(c.label + ", " + DTypeName(dtype));
  const Outputs cpu = RunSteps(c, dtype, Device::CPU(), false);
  const Outputs dev = RunSteps(c, dtype, device, false);
  const Outputs magnitudes = RunSteps(c, dtype, Device::CPU(), true);
  EXPECT_EQ(dev.fallbacks, 0) << "ran the CPU kernel on the test device";
  const double eps = dtype == DType::kF64 ? std::numeric_limits<double>::epsilon()
                                          : std::numeric_limits<float>::epsilon();
  // One rounding of a 16-bit output (see the top).
  const auto output_eps = [](DType t) {
    return t == DType::kBF16 ? 0x1p-7 : t == DType::kF16 ? 0x1p-10 : 0.0;
  };
  ASSERT_EQ(cpu.tensors.size(), dev.tensors.size());
  ASSERT_EQ(cpu.tensors.size(), cpu.terms.size());
  for (size_t t = 0; t < cpu.tensors.size(); ++t) {
    ASSERT_EQ(cpu.tensors[t].shape(), dev.tensors[t].shape()) << cpu.names[t];
    ASSERT_EQ(cpu.tensors[t].format(), dev.tensors[t].format()) << cpu.names[t];
    const std::vector<double> a = Elements(cpu.tensors[t]), b = Elements(dev.tensors[t]);
    const std::vector<double> m = Elements(magnitudes.tensors[t]);
    const double n = static_cast<double>(cpu.terms[t]);
    const double rounding = output_eps(cpu.tensors[t].dtype());
    int bad = 0;
    for (size_t i = 0; i < a.size() && bad < 5; ++i) {
      const double bound = factor * 2 * (n * eps + rounding) * m[i];
      if (!(std::fabs(a[i] - b[i]) <= bound)) {
        ADD_FAILURE() << cpu.names[t] << "[" << i << "]: CPU " << a[i] << ", " << device.ToString()
                      << " " << b[i] << ", bound " << bound;
        ++bad;
      }
    }
  }
}

inline Settings Conv(int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                     std::vector<int64_t> pad, std::vector<int64_t> dilation, int64_t groups,
                     bool bias) {
  Settings s;
  s.Set("num_output", out).SetInts("kernel", kernel).SetInts("stride", stride);
  s.SetInts("pad", pad).SetInts("dilation", dilation).Set("groups", groups).Set("bias", bias);
  return s;
}

// Odd shapes: 1x1, 3x3 and 7x7 kernels, asymmetric ones, strides, padding, dilation, groups
// (depthwise too), 3, 10 and 17 channels, with and without a bias.
inline std::vector<Case> ConvCases() {
  std::vector<Case> cases;
  const std::vector<std::pair<std::string, std::pair<Settings, Shape>>> shapes = {
      {"3x3 pad 1, 3 -> 10", {Conv(10, {3}, {1}, {1}, {1}, 1, true), {2, 3, 7, 6}}},
      {"7x7 stride 2 pad 3, 3 -> 17", {Conv(17, {7}, {2}, {3}, {1}, 1, true), {2, 3, 13, 11}}},
      {"1x1, 17 -> 10, no bias", {Conv(10, {1}, {1}, {0}, {1}, 1, false), {2, 17, 5, 4}}},
      {"1x1 stride 2, 10 -> 17", {Conv(17, {1}, {2}, {0}, {1}, 1, true), {3, 10, 7, 7}}},
      {"3x3 stride 2 pad 2 dilation 2, groups 5, 10 -> 10",
       {Conv(10, {3}, {2}, {2}, {2}, 5, true), {2, 10, 9, 8}}},
      {"3x3 depthwise, 17", {Conv(17, {3}, {1}, {1}, {1}, 17, false), {2, 17, 6, 7}}},
      {"3x5 stride 2x3 pad 2x1 dilation 1x2, 10 -> 3",
       {Conv(3, {3, 5}, {2, 3}, {2, 1}, {1, 2}, 1, false), {2, 10, 11, 13}}},
  };
  for (const auto& [label, sp] : shapes) {
    for (MemoryFormat format : {MemoryFormat::kNCHW, MemoryFormat::kNHWC}) {
      cases.push_back({"Convolution", sp.first, sp.second, format,
                       label + (format == MemoryFormat::kNHWC ? ", NHWC" : ", NCHW")});
    }
  }
  return cases;
}

inline std::vector<Case> InnerProductCases() {
  Settings with_bias, without_bias;
  with_bias.Set("num_output", 10);
  without_bias.Set("num_output", 17).Set("bias", false);
  return {{"InnerProduct", with_bias, {3, 17}, MemoryFormat::kNCHW, "17 -> 10"},
          {"InnerProduct", without_bias, {2, 3, 4, 5}, MemoryFormat::kNCHW, "60 -> 17, no bias"},
          {"InnerProduct", with_bias, {5, 3}, MemoryFormat::kNCHW, "3 -> 10"}};
}

// The checks, one test's body each. `dtypes`: f32 and f64 on the test device, f32 on a GPU (cuDNN
// and cuBLASLt have no f64). `factor`: 1 on the test device; on a GPU cuDNN may choose a
// transform engine (Winograd, FFT: allowed by ConvEngineFilter), whose rounding is not the
// products' and sums' alone, so the GPU's checks allow 8 times the bound (a guess until a GPU
// has run them).
inline void CheckConvolutionPasses(Device device, const std::vector<DType>& dtypes, double factor) {
  for (DType dtype : dtypes) {
    for (const Case& c : ConvCases()) ExpectWithinTheBound(c, dtype, device, factor);
  }
}

inline void CheckInnerProducts(Device device, const std::vector<DType>& dtypes, double factor) {
  for (DType dtype : dtypes) {
    for (const Case& c : InnerProductCases()) ExpectWithinTheBound(c, dtype, device, factor);
  }
}

// Without propagate_down the input gradient keeps what it held (-7), on the CPU and the device.
inline void CheckInputGradientLeftAlone(Device device) {
  for (const Case& c : {ConvCases()[1], InnerProductCases()[0]}) {
    const Outputs dev = RunSteps(c, DType::kF32, device, false, /*propagate=*/false);
    const Outputs cpu = RunSteps(c, DType::kF32, Device::CPU(), false, /*propagate=*/false);
    for (size_t t = 0; t < dev.tensors.size(); ++t) {
      if (dev.names[t].rfind("dx", 0) != 0) continue;
      for (double v : Elements(dev.tensors[t]))
        ASSERT_EQ(v, -7.0) << c.label << " " << dev.names[t];
      for (double v : Elements(cpu.tensors[t]))
        ASSERT_EQ(v, -7.0) << c.label << " " << dev.names[t];
    }
  }
}

}  // namespace cortado::testing::conv_device
