// Every image layer on channels-last (NHWC) tensors against the same layer on NCHW ones: the
// same logical outputs and gradients. Element-wise layers, pooling, concatenation and the
// reorder compute the same operations in the same order, so they agree bit for bit; batch
// norm's per-channel sums run in another order (blocks of rows instead of planes), so it agrees
// within a derived bound (BatchNormMatchesWithinItsBound).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/base/thread_pool.h"
#include "tests/layers/layer_harness.h"

namespace cortado::testing {
namespace {

constexpr double kUnit = 1.0 / 16777216.0;  // 2^-24, f32's unit roundoff

Tensor Nchw(const Tensor& t) { return t.ndim() == 4 ? t.Reordered(MemoryFormat::kNCHW) : t; }

void ExpectBitwise(const char* what, const Tensor& a_any, const Tensor& b_any) {
  const Tensor a = Nchw(a_any), b = Nchw(b_any);
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = ElementAsDouble(a, i), y = ElementAsDouble(b, i);
    if (!(x == y || (std::isnan(x) && std::isnan(y)))) {
      FAIL() << what << ": element " << i << " is " << x << " in NHWC, " << y << " in NCHW";
    }
  }
}

// A tensor of `dtype` with RandomTensor's values (rounded to it).
Tensor Values(const Shape& shape, DType dtype, uint64_t seed, bool distinct = false) {
  Tensor f =
      distinct ? DistinctTensor(shape, DType::kF32, seed) : RandomTensor(shape, DType::kF32, seed);
  if (dtype == DType::kF32) return f;
  Tensor t(shape, dtype);
  t.ConvertFrom(f);
  return t;
}

// Runs `type` on NCHW inputs and on their NHWC copies, forward and backward; outputs and input
// gradients must agree bit for bit; parameter gradients too.
void ExpectSameInBothFormats(const std::string& type, const Settings& settings,
                             const std::vector<Tensor>& inputs, Phase phase = Phase::kTrain) {
  SCOPED_TRACE(StrCat(type, " ", inputs[0].ToString()));
  std::vector<Tensor> nhwc;
  for (const Tensor& t : inputs) nhwc.push_back(t.Reordered(MemoryFormat::kNHWC));
  LayerHarness a(type, settings, inputs, 1, phase), b(type, settings, nhwc, 1, phase);
  ASSERT_TRUE(b.layer().TakesChannelsLast());
  a.Forward();
  b.Forward();
  EXPECT_EQ(b.top()[0]->data.format(), MemoryFormat::kNHWC);
  ExpectBitwise("output", b.top()[0]->data, a.top()[0]->data);
  const Tensor dy = Values(a.top()[0]->data.shape(), a.top()[0]->data.dtype(), 99);
  a.Backward({dy});
  b.Backward({dy});
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!a.bottom()[i]->grad.defined()) continue;
    ExpectBitwise("input gradient", b.bottom()[i]->grad, a.bottom()[i]->grad);
  }
  for (size_t p = 0; p < a.layer().params().size(); ++p) {
    ExpectBitwise("parameter gradient", b.layer().params()[p].grad, a.layer().params()[p].grad);
  }
}

const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(ChannelsLast, ElementWiseLayersAreBitwiseTheSame) {
  for (DType t : kTypes) {
    const Shape shape{3, 5, 4, 7};
    ExpectSameInBothFormats("ReLU", Settings(), {Values(shape, t, 1)});
    Settings leaky;
    leaky.Set("negative_slope", 0.1);
    ExpectSameInBothFormats("ReLU", leaky, {Values(shape, t, 1)});
    for (const char* op : {"sum", "prod", "max"}) {
      Settings s;
      s.Set("operation", op);
      ExpectSameInBothFormats("Eltwise", s, {Values(shape, t, 2, true), Values(shape, t, 3, true)});
    }
    Settings fused;
    fused.Set("operation", "sum").Set("relu", true).SetList("coeffs", {"1", "-0.5"});
    ExpectSameInBothFormats("Eltwise", fused, {Values(shape, t, 4), Values(shape, t, 5)});
  }
}

// Dropout draws its mask by the element's logical (N, C, H, W) index: the same mask in both.
TEST(ChannelsLast, DropoutDrawsTheSameMask) {
  Settings s;
  s.Set("ratio", 0.3);
  ExpectSameInBothFormats("Dropout", s, {Values({4, 6, 3, 5}, DType::kF32, 6)});
}

TEST(ChannelsLast, PoolingIsBitwiseTheSame) {
  struct P {
    const char* pool;
    int64_t kernel, stride, pad;
    bool global, ceil, include_pad;
  };
  const P cases[] = {
      {"max", 2, 2, 0, false, false, true}, {"max", 3, 2, 1, false, false, true},
      {"max", 3, 2, 1, false, true, true},  {"ave", 3, 1, 1, false, false, true},
      {"ave", 3, 2, 1, false, true, false}, {"ave", 2, 2, 0, false, false, true},
      {"max", 0, 0, 0, true, false, true},  {"ave", 0, 0, 0, true, false, true},
  };
  for (DType t : kTypes) {
    for (const P& p : cases) {
      Settings s;
      s.Set("pool", p.pool);
      if (p.global) {
        s.Set("global", true);
      } else {
        s.Set("kernel", p.kernel).Set("stride", p.stride).Set("pad", p.pad);
        s.Set("ceil_mode", p.ceil).Set("count_include_pad", p.include_pad);
      }
      // Distinct values: no ties to break, so max pooling's routing is unambiguous.
      const Tensor x = Values({2, 17, 9, 11}, t, 7, /*distinct=*/true);
      ExpectSameInBothFormats("Pooling", s, {x});
    }
  }
}

TEST(ChannelsLast, ConcatJoinsAlongTheLogicalAxis) {
  for (int64_t axis : {1, 2, 3, 0}) {
    Shape a{2, 3, 4, 5}, b{2, 3, 4, 5};
    b[static_cast<size_t>(axis)] += 2;
    Settings s;
    s.Set("axis", axis);
    ExpectSameInBothFormats("Concat", s, {Values(a, DType::kF32, 8), Values(b, DType::kF32, 9)});
  }
}

TEST(ChannelsLast, ReorderLayerMovesBothWays) {
  Settings to_nhwc;
  to_nhwc.Set("format", "nhwc");
  LayerHarness h("Reorder", to_nhwc, {Values({2, 5, 3, 4}, DType::kF32, 10)});
  h.Forward();
  EXPECT_TRUE(h.top()[0]->data.channels_last());
  ExpectBitwise("output", h.top()[0]->data, h.bottom()[0]->data);
  const Tensor dy = Values({2, 5, 3, 4}, DType::kF32, 11);
  h.Backward({dy});
  EXPECT_FALSE(h.bottom()[0]->grad.channels_last());
  ExpectBitwise("input gradient", h.bottom()[0]->grad, dy);
}

// A layer that takes NCHW only refuses a channels-last input, naming itself and the blob.
TEST(ChannelsLast, NchwOnlyLayersRefuseChannelsLastInputs) {
  Settings s;
  s.Set("num_output", 3);
  const Tensor x = Values({2, 4, 3, 3}, DType::kF32, 12);
  LayerHarness h("InnerProduct", s, {x});
  h.bottom()[0]->data = x.Reordered(MemoryFormat::kNHWC);
  try {
    h.Forward();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'layer' (InnerProduct)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("channels-last"), std::string::npos) << e.what();
  }
}

// Batch norm over rows of channels (NHWC) against planes (NCHW): the per-channel sums are
// accumulated in double in another order, so the statistics agree to about 1e-15 relative and
// the f32 coefficients a = gamma invstd, mean and beta round to values at most one ulp apart.
// Then y = a (x - m) + b differs by at most |da| |x - m| + |a| |dm| plus two roundings on each
// side: <= 8 u (|a| (|x| + 2 |m|) + |b|) per element. Backward's dx = A g + B (x - m) + C alike:
// <= 8 u (|A| |g| + |B| (|x| + 2 |m|) + |C|). The coefficients are computed here in double.
TEST(ChannelsLast, BatchNormMatchesWithinItsBound) {
  for (bool relu : {false, true}) {
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(StrCat("relu ", relu, " threads ", threads));
      const int saved = NumThreads();
      SetNumThreads(threads);
      const int64_t n = 4, c = 17, h = 9, w = 11, count = n * h * w;
      Settings s;
      s.Set("relu", relu);
      Tensor x = Values({n, c, h, w}, DType::kF32, 13);
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += 3.0f;  // |mean| > std
      LayerHarness a("BatchNorm", s, {x}), b("BatchNorm", s, {x.Reordered(MemoryFormat::kNHWC)});
      Rng rng(5);
      for (LayerHarness* l : {&a, &b}) {
        Rng r(5);
        for (int64_t i = 0; i < c; ++i) {
          l->layer().params()[0].value.data<float>()[i] = static_cast<float>(r.Uniform(0.5, 1.5));
          l->layer().params()[1].value.data<float>()[i] = static_cast<float>(r.Uniform(-1, 1));
        }
      }
      a.Forward();
      b.Forward();
      const Tensor dy = Values({n, c, h, w}, DType::kF32, 14);
      a.Backward({dy});
      b.Backward({dy});
      const Tensor ya = a.top()[0]->data, yb = Nchw(b.top()[0]->data);
      const Tensor dxa = a.bottom()[0]->grad, dxb = Nchw(b.bottom()[0]->grad);
      const float* gamma = a.layer().params()[0].value.data<float>();
      const float* beta = a.layer().params()[1].value.data<float>();
      for (int64_t ch = 0; ch < c; ++ch) {
        double s1 = 0, s2 = 0;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t p = 0; p < h * w; ++p) {
            const double v = x.data<float>()[(i * c + ch) * h * w + p];
            s1 += v;
            s2 += v * v;
          }
        const double mean = s1 / count, invstd = 1 / std::sqrt(s2 / count - mean * mean + 1e-5);
        const double ac = gamma[ch] * invstd, bc = beta[ch];
        double sg = 0, sgx = 0;  // the masked gradient's sums, for A, B, C
        for (int64_t i = 0; i < n; ++i)
          for (int64_t p = 0; p < h * w; ++p) {
            const int64_t at = (i * c + ch) * h * w + p;
            const double g = relu && !(ya.data<float>()[at] > 0) ? 0.0 : dy.data<float>()[at];
            sg += g;
            sgx += g * (x.data<float>()[at] - mean);
          }
        const double ca = ac, cb = -ac * invstd * invstd * sgx / count, cc = -ac * sg / count;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t p = 0; p < h * w; ++p) {
            const int64_t at = (i * c + ch) * h * w + p;
            const double xv = std::fabs(x.data<float>()[at]);
            const double ybound =
                8 * kUnit * (std::fabs(ac) * (xv + 2 * std::fabs(mean)) + std::fabs(bc));
            ASSERT_LE(std::fabs(ya.data<float>()[at] - yb.data<float>()[at]), ybound) << at;
            // Where the fused ReLU's output sits at 0 in one layout and just above in the other,
            // the masks differ: the outputs' bound says how close to 0 that can happen.
            if (relu && (ya.data<float>()[at] > 0) != (yb.data<float>()[at] > 0)) continue;
            const double g = std::fabs(dy.data<float>()[at]);
            const double dbound =
                8 * kUnit *
                (std::fabs(ca) * g + std::fabs(cb) * (xv + 2 * std::fabs(mean)) + std::fabs(cc));
            ASSERT_LE(std::fabs(dxa.data<float>()[at] - dxb.data<float>()[at]), dbound) << at;
          }
      }
      SetNumThreads(saved);
    }
  }
}

// The channels-last statistics add their blocks in block order: the same bits at any thread
// count.
TEST(ChannelsLast, BatchNormIsTheSameAtAnyThreadCount) {
  const Tensor x = Values({3, 10, 23, 29}, DType::kF32, 15).Reordered(MemoryFormat::kNHWC);
  std::vector<Tensor> ys;
  for (int threads : {1, 2, 3}) {
    const int saved = NumThreads();
    SetNumThreads(threads);
    LayerHarness h("BatchNorm", Settings(), {x});
    h.Forward();
    ys.push_back(h.top()[0]->data.Clone());
    SetNumThreads(saved);
  }
  EXPECT_EQ(0, std::memcmp(ys[0].raw_data(), ys[1].raw_data(), ys[0].nbytes()));
  EXPECT_EQ(0, std::memcmp(ys[0].raw_data(), ys[2].raw_data(), ys[0].nbytes()));
}

}  // namespace
}  // namespace cortado::testing
