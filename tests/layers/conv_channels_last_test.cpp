// The channels-last convolution (oneDNN's primitives, engine/graph/conv_onednn.h) against the
// im2col reference path on NCHW copies of the same tensors, on odd shapes: strides, padding,
// dilation, groups, 1x1 / 3x3 / 7x7 and rectangular kernels, channel counts 3, 10 and 17, batches
// that split unevenly over threads; f32, bf16 (native where the CPU has AVX512_BF16, widened to
// f32 where it does not, e.g. under CORTADO_CPU_ISA=avx2) and f16 (widened); and its backward
// passes against its own forward (the adjoint identities, a numerical-gradient check that is
// exact for a linear map up to rounding).
//
// Bounds, derived so that they hold on any x86-64 with AVX2 whatever order or FMA use a kernel
// picks: each output is a sum of K products of the same operands (16-bit operands multiply
// exactly in f32); any f32 summation of K terms lies within gamma_K * S of the exact sum,
// gamma_K = K u / (1 - K u), u = 2^-24, S = the sum of the terms' magnitudes (Higham, "Accuracy
// and Stability of Numerical Algorithms", 3.1), so two kernels differ by at most 2 gamma_K S per
// element. S is computed in f64 by the reference on |x|, |w|, |dy|. 16-bit outputs are then each
// rounded once more: + u16 (|y1| + |y2|) / (1 - u16) with u16 = 2^-8 (bf16) or 2^-11 (f16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/base/thread_pool.h"
#include "engine/graph/conv_onednn.h"
#include "layers/conv.h"
#include "tests/layers/layer_harness.h"

namespace cortado::testing {
namespace {

struct Case {
  int64_t n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  bool bias;
};

const Case kCases[] = {
    // n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups, bias
    {3, 3, 15, 13, 10, 7, 7, 2, 2, 3, 3, 1, 1, 1, false},   // a ResNet stem on 3 channels
    {5, 10, 9, 9, 17, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},     // 3x3 "same", 5 images over threads
    {3, 17, 8, 10, 10, 1, 1, 2, 2, 0, 0, 1, 1, 1, false},   // 1x1 projection at stride 2
    {2, 17, 7, 7, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},      // 1x1 to 3 channels
    {2, 10, 12, 11, 10, 3, 3, 1, 1, 2, 2, 2, 2, 1, false},  // dilated "same"
    {3, 10, 9, 9, 10, 3, 3, 2, 2, 1, 1, 1, 1, 5, true},     // groups of 2 channels, stride 2
    {2, 3, 8, 8, 3, 3, 3, 1, 1, 1, 1, 1, 1, 3, false},      // depthwise
    {1, 17, 5, 6, 17, 3, 3, 2, 2, 1, 1, 2, 2, 1, true},     // dilated and strided, one image
    {4, 10, 11, 9, 17, 3, 1, 2, 1, 1, 0, 1, 1, 1, false},   // rectangular kernel and stride
    {2, 3, 8, 9, 10, 7, 7, 1, 1, 0, 0, 1, 1, 1, true},      // 7x7, no padding
};

constexpr double kUnit = 1.0 / 16777216.0;  // 2^-24

double Gamma(int64_t k) { return static_cast<double>(k) * kUnit / (1 - k * kUnit); }

double Unit16(DType dtype) {
  return dtype == DType::kBF16 ? 1.0 / 256.0 : dtype == DType::kF16 ? 1.0 / 2048.0 : 0.0;
}

std::string Name(const Case& c) {
  return StrCat("n=", c.n, " cin=", c.cin, " ", c.h, "x", c.w, " cout=", c.cout, " k=", c.kh, "x",
                c.kw, " s=", c.sh, "x", c.sw, " p=", c.ph, "x", c.pw, " d=", c.dh, "x", c.dw,
                " g=", c.groups, c.bias ? " bias" : "");
}

Settings ConvSettings(const Case& c) {
  Settings s;
  s.Set("num_output", c.cout).SetInts("kernel", {c.kh, c.kw}).SetInts("stride", {c.sh, c.sw});
  s.SetInts("pad", {c.ph, c.pw}).SetInts("dilation", {c.dh, c.dw}).Set("groups", c.groups);
  s.Set("bias", c.bias);
  return s;
}

// A tensor of `dtype` holding RandomTensor's f32 values rounded to it.
Tensor Random(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor f = RandomTensor(shape, DType::kF32, seed);
  if (dtype == DType::kF32) return f;
  Tensor t(shape, dtype);
  t.ConvertFrom(f);
  return t;
}

// |t| in f64 (NCHW), the values first rounded to `storage` (what the kernels multiply).
Tensor Magnitudes(const Tensor& t, DType storage) {
  Tensor rounded = t;
  if (storage != t.dtype() && IsLowPrecision(storage)) {
    rounded = Tensor(t.shape(), storage);
    rounded.set_format(t.format());
    rounded.ConvertFrom(t);
  }
  const Tensor nchw = rounded.ndim() == 4 ? rounded.Reordered(MemoryFormat::kNCHW) : rounded;
  Tensor out(t.shape(), DType::kF64);
  for (int64_t i = 0; i < out.numel(); ++i)
    out.data<double>()[i] = std::fabs(ElementAsDouble(nchw, i));
  return out;
}

// Every element of `got` (any format) within 2 gamma_terms S + u16 (|got| + |want|) / (1 - u16)
// of `want` (NCHW), S from `magnitude` (NCHW f64).
void ExpectWithin(const char* what, const Tensor& got_any, const Tensor& want_any,
                  const Tensor& magnitude, int64_t terms, double u16) {
  const Tensor got = got_any.ndim() == 4 ? got_any.Reordered(MemoryFormat::kNCHW) : got_any;
  const Tensor want = want_any.ndim() == 4 ? want_any.Reordered(MemoryFormat::kNCHW) : want_any;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const double gamma = Gamma(terms);
  int64_t worst = -1;
  double worst_ratio = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = ElementAsDouble(got, i), b = ElementAsDouble(want, i);
    const double bound = 2 * gamma * magnitude.data<double>()[i] +
                         u16 * (std::fabs(a) + std::fabs(b)) / (1 - u16) + 1e-30;
    const double ratio = std::fabs(a - b) / bound;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_LE(worst_ratio, 1.0) << what << ": element " << worst << " is "
                              << ElementAsDouble(got, worst) << ", the reference "
                              << ElementAsDouble(want, worst) << " (" << worst_ratio
                              << " times the bound; S " << magnitude.data<double>()[worst] << ")";
}

// Runs one case in `dtype` at `threads`: the channels-last layer against the NCHW one (same
// name and seed, so the same initial weights), forward and backward.
void RunCase(const Case& c, DType dtype, int threads) {
  SCOPED_TRACE(StrCat(Name(c), " ", DTypeName(dtype), " threads=", threads));
  const int saved = NumThreads();
  SetNumThreads(threads);
  const Tensor x = Random({c.n, c.cin, c.h, c.w}, dtype, 1);
  LayerHarness ref("Convolution", ConvSettings(c), {x});
  LayerHarness fast("Convolution", ConvSettings(c), {x.Reordered(MemoryFormat::kNHWC)});
  auto& conv = static_cast<ConvolutionLayer&>(fast.layer());
  ASSERT_TRUE(conv.fast_path()) << conv.KernelInfo();
  fast.Forward();
  ref.Forward();
  EXPECT_TRUE(fast.top()[0]->data.channels_last());
  const Tensor dy = Random(ref.top()[0]->data.shape(), dtype, 2);
  fast.Backward({dy});
  ref.Backward({dy});
  EXPECT_TRUE(fast.bottom()[0]->grad.channels_last());

  // The magnitudes S: the f64 reference on |x|, |w|, |dy| (|b| too).
  LayerHarness mag("Convolution", ConvSettings(c), {Magnitudes(x, dtype)});
  mag.layer().params()[0].value.CopyFrom(Magnitudes(ref.layer().params()[0].value, dtype));
  if (c.bias)
    mag.layer().params()[1].value.CopyFrom(Magnitudes(ref.layer().params()[1].value, dtype));
  mag.Forward();
  mag.Backward({Magnitudes(dy, dtype)});

  const int64_t positions = c.n * ref.top()[0]->data.dim(2) * ref.top()[0]->data.dim(3);
  const double u16 = Unit16(dtype);
  ExpectWithin("output", fast.top()[0]->data, ref.top()[0]->data, mag.top()[0]->data,
               c.cin / c.groups * c.kh * c.kw + 1, u16);
  ExpectWithin("input gradient", fast.bottom()[0]->grad, ref.bottom()[0]->grad,
               mag.bottom()[0]->grad, c.cout / c.groups * c.kh * c.kw, u16);
  ExpectWithin("weight gradient", fast.layer().params()[0].grad, ref.layer().params()[0].grad,
               mag.layer().params()[0].grad, positions, 0);
  if (c.bias) {
    ExpectWithin("bias gradient", fast.layer().params()[1].grad, ref.layer().params()[1].grad,
                 mag.layer().params()[1].grad, positions, 0);
  }

  // Same inputs, same thread count: bitwise the same again (a second call reuses primitives).
  const Tensor y0 = fast.top()[0]->data.Clone(), dx0 = fast.bottom()[0]->grad.Clone();
  const Tensor dw0 = fast.layer().params()[0].grad.Clone();
  fast.Forward();
  fast.Backward({dy});
  EXPECT_EQ(0, std::memcmp(y0.raw_data(), fast.top()[0]->data.raw_data(), y0.nbytes()));
  EXPECT_EQ(0, std::memcmp(dx0.raw_data(), fast.bottom()[0]->grad.raw_data(), dx0.nbytes()));
  EXPECT_EQ(0, std::memcmp(dw0.raw_data(), fast.layer().params()[0].grad.raw_data(), dw0.nbytes()));
  SetNumThreads(saved);
}

TEST(ConvolutionChannelsLast, MatchesTheIm2colReferenceInF32) {
  if (!ChannelsLastConv::Built()) GTEST_SKIP() << "this build has no oneDNN";
  for (const Case& c : kCases) {
    for (int threads : {1, 2, 3}) RunCase(c, DType::kF32, threads);
  }
}

TEST(ConvolutionChannelsLast, MatchesTheIm2colReferenceInBF16AndF16) {
  if (!ChannelsLastConv::Built()) GTEST_SKIP() << "this build has no oneDNN";
  for (const Case& c : kCases) {
    RunCase(c, DType::kBF16, 2);
    RunCase(c, DType::kF16, 2);
  }
}

// The backward passes are the adjoints of the forward pass (with the bias left out, y is linear
// in x and in w): <dy, y - b> = <dx, x> = <dw, w>, each side an f64 sum of f32 kernel outputs,
// so the sides differ by the kernels' rounding alone: at most gamma_K1 <|dy|, S_y> +
// gamma_K2 <|x|, S_dx> (and alike for w), S from the f64 reference on magnitudes.
TEST(ConvolutionChannelsLast, BackwardIsTheAdjointOfForward) {
  if (!ChannelsLastConv::Built()) GTEST_SKIP() << "this build has no oneDNN";
  for (const Case& c0 : kCases) {
    Case c = c0;
    c.bias = false;
    SCOPED_TRACE(Name(c));
    const Tensor x = Random({c.n, c.cin, c.h, c.w}, DType::kF32, 3);
    LayerHarness fast("Convolution", ConvSettings(c), {x.Reordered(MemoryFormat::kNHWC)});
    fast.Forward();
    const Tensor dy = Random(fast.top()[0]->data.shape(), DType::kF32, 4);
    fast.Backward({dy});
    LayerHarness mag("Convolution", ConvSettings(c), {Magnitudes(x, DType::kF32)});
    mag.layer().params()[0].value.CopyFrom(Magnitudes(fast.layer().params()[0].value, DType::kF32));
    mag.Forward();
    mag.Backward({Magnitudes(dy, DType::kF32)});
    const Tensor y = fast.top()[0]->data.Reordered(MemoryFormat::kNCHW);
    const Tensor dx = fast.bottom()[0]->grad.Reordered(MemoryFormat::kNCHW);
    const Tensor& w = fast.layer().params()[0].value;
    const Tensor& dw = fast.layer().params()[0].grad;
    double dy_y = 0, dy_sy = 0, dx_x = 0, x_sdx = 0, dw_w = 0, w_sdw = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      dy_y += ElementAsDouble(dy, i) * ElementAsDouble(y, i);
      dy_sy += std::fabs(ElementAsDouble(dy, i)) * mag.top()[0]->data.data<double>()[i];
    }
    for (int64_t i = 0; i < x.numel(); ++i) {
      dx_x += ElementAsDouble(dx, i) * ElementAsDouble(x, i);
      x_sdx += std::fabs(ElementAsDouble(x, i)) * mag.bottom()[0]->grad.data<double>()[i];
    }
    for (int64_t i = 0; i < w.numel(); ++i) {
      dw_w += ElementAsDouble(dw, i) * ElementAsDouble(w, i);
      w_sdw += std::fabs(ElementAsDouble(w, i)) * mag.layer().params()[0].grad.data<double>()[i];
    }
    const int64_t k_fwd = c.cin / c.groups * c.kh * c.kw, k_bwd = c.cout / c.groups * c.kh * c.kw;
    const int64_t k_w = c.n * y.dim(2) * y.dim(3);
    // The f64 sums of the products add a relative 1e-15 at most; 1e-12 of the magnitudes covers it.
    EXPECT_LE(std::fabs(dy_y - dx_x), Gamma(k_fwd) * dy_sy + Gamma(k_bwd) * x_sdx + 1e-12 * dy_sy);
    EXPECT_LE(std::fabs(dy_y - dw_w), Gamma(k_fwd) * dy_sy + Gamma(k_w) * w_sdw + 1e-12 * dy_sy);
  }
}

// Call after call on two threads, forward and backward give the same bits. (oneDNN's own
// scratchpad is one buffer for the whole process in Debian's build: two threads running
// primitives at once overwrote each other's, and about one forward in fifty came out wrong.)
TEST(ConvolutionChannelsLast, ConcurrentThreadsRepeatCallAfterCall) {
  if (!ChannelsLastConv::Built()) GTEST_SKIP() << "this build has no oneDNN";
  const int saved = NumThreads();
  SetNumThreads(2);
  const Case c = kCases[6];  // depthwise: the kernel whose scratchpad showed it
  LayerHarness h("Convolution", ConvSettings(c),
                 {Random({c.n, c.cin, c.h, c.w}, DType::kF32, 9).Reordered(MemoryFormat::kNHWC)});
  h.Forward();
  const Tensor y0 = h.top()[0]->data.Clone();
  const Tensor dy = Random(y0.shape(), DType::kF32, 10);
  h.Backward({dy});
  const Tensor dx0 = h.bottom()[0]->grad.Clone();
  int differ = 0;
  for (int i = 0; i < 200; ++i) {
    h.Forward();
    h.Backward({dy});
    differ += std::memcmp(y0.raw_data(), h.top()[0]->data.raw_data(), y0.nbytes()) != 0;
    differ += std::memcmp(dx0.raw_data(), h.bottom()[0]->grad.raw_data(), dx0.nbytes()) != 0;
  }
  EXPECT_EQ(differ, 0);
  SetNumThreads(saved);
}

// f64 (the gradient checks' dtype) has no oneDNN kernel: a channels-last input runs the
// reference on NCHW copies, with the same results as an NCHW input, bit for bit.
TEST(ConvolutionChannelsLast, F64FallsBackToTheReferenceBitwise) {
  const Case c = kCases[1];
  const Tensor x = RandomTensor({c.n, c.cin, c.h, c.w}, DType::kF64, 5);
  LayerHarness ref("Convolution", ConvSettings(c), {x});
  LayerHarness nhwc("Convolution", ConvSettings(c), {x.Reordered(MemoryFormat::kNHWC)});
  EXPECT_FALSE(static_cast<ConvolutionLayer&>(nhwc.layer()).fast_path());
  EXPECT_NE(nhwc.layer().KernelInfo().find("im2col"), std::string::npos)
      << nhwc.layer().KernelInfo();
  ref.Forward();
  nhwc.Forward();
  const Tensor dy = RandomTensor(ref.top()[0]->data.shape(), DType::kF64, 6);
  ref.Backward({dy});
  nhwc.Backward({dy});
  const Tensor y = nhwc.top()[0]->data.Reordered(MemoryFormat::kNCHW);
  const Tensor dx = nhwc.bottom()[0]->grad.Reordered(MemoryFormat::kNCHW);
  EXPECT_EQ(0, std::memcmp(y.raw_data(), ref.top()[0]->data.raw_data(), y.nbytes()));
  EXPECT_EQ(0, std::memcmp(dx.raw_data(), ref.bottom()[0]->grad.raw_data(), dx.nbytes()));
  EXPECT_EQ(0, std::memcmp(nhwc.layer().params()[0].grad.raw_data(),
                           ref.layer().params()[0].grad.raw_data(),
                           ref.layer().params()[0].grad.nbytes()));
}

// A batch of another size (a short last evaluation batch) builds primitives of its own with
// the weights' format of the first, within the same bounds of the reference.
TEST(ConvolutionChannelsLast, AnotherBatchSizeInTheSameLayer) {
  if (!ChannelsLastConv::Built()) GTEST_SKIP() << "this build has no oneDNN";
  const Case c = kCases[1];
  LayerHarness h("Convolution", ConvSettings(c),
                 {Random({6, c.cin, c.h, c.w}, DType::kF32, 7).Reordered(MemoryFormat::kNHWC)});
  h.Forward();
  for (int64_t n : {int64_t{1}, int64_t{3}}) {
    SCOPED_TRACE(StrCat(n, " images after 6"));
    const Tensor x = Random({n, c.cin, c.h, c.w}, DType::kF32, 8);
    h.bottom()[0]->data = x.Reordered(MemoryFormat::kNHWC);
    h.Forward();
    LayerHarness ref("Convolution", ConvSettings(c), {x});
    ref.Forward();
    LayerHarness mag("Convolution", ConvSettings(c), {Magnitudes(x, DType::kF32)});
    mag.layer().params()[0].value.CopyFrom(Magnitudes(ref.layer().params()[0].value, DType::kF32));
    mag.layer().params()[1].value.CopyFrom(Magnitudes(ref.layer().params()[1].value, DType::kF32));
    mag.Forward();
    ExpectWithin("output", h.top()[0]->data, ref.top()[0]->data, mag.top()[0]->data,
                 c.cin * c.kh * c.kw + 1, 0);
  }
}

}  // namespace
}  // namespace cortado::testing
