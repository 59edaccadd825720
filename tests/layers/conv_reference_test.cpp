// Convolution against a direct (seven nested loops) reference on shapes large enough to reach
// every code path of the im2col + GEMM implementation: several images per GEMM block, several
// blocks per thread with a short last block, the 1x1 shortcut, groups, and 1, 2 and 3 threads.
// Also checks that results are bitwise reproducible at a fixed thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/base/thread_pool.h"
#include "layers/conv.h"
#include "tests/layers/layer_harness.h"

namespace cortado::testing {
namespace {

struct ConvConfig {
  int64_t n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  bool bias;
};

int64_t OutSize(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// Direct convolution in double: y, and for upstream dy the gradients dx, dw, db.
void Reference(const ConvConfig& c, const std::vector<double>& x, const std::vector<double>& w,
               const std::vector<double>& b, const std::vector<double>& dy, std::vector<double>* y,
               std::vector<double>* dx, std::vector<double>* dw, std::vector<double>* db) {
  const int64_t oh = OutSize(c.h, c.kh, c.sh, c.ph, c.dh),
                ow = OutSize(c.w, c.kw, c.sw, c.pw, c.dw);
  const int64_t cig = c.cin / c.groups, cog = c.cout / c.groups;
  y->assign(c.n * c.cout * oh * ow, 0.0);
  dx->assign(x.size(), 0.0);
  dw->assign(w.size(), 0.0);
  db->assign(c.cout, 0.0);
  for (int64_t n = 0; n < c.n; ++n)
    for (int64_t co = 0; co < c.cout; ++co) {
      const int64_t g = co / cog;
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t yi = ((n * c.cout + co) * oh + i) * ow + j;
          double acc = c.bias ? b[co] : 0.0;
          const double gy = dy[yi];
          (*db)[co] += gy;
          for (int64_t ci = 0; ci < cig; ++ci)
            for (int64_t ki = 0; ki < c.kh; ++ki)
              for (int64_t kj = 0; kj < c.kw; ++kj) {
                const int64_t ih = i * c.sh - c.ph + ki * c.dh, iw = j * c.sw - c.pw + kj * c.dw;
                if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
                const int64_t xi = ((n * c.cin + g * cig + ci) * c.h + ih) * c.w + iw;
                const int64_t wi = ((co * cig + ci) * c.kh + ki) * c.kw + kj;
                acc += x[xi] * w[wi];
                (*dx)[xi] += gy * w[wi];
                (*dw)[wi] += gy * x[xi];
              }
          (*y)[yi] = acc;
        }
    }
}

std::vector<double> ToVector(const Tensor& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = ElementAsDouble(t, i);
  return v;
}

void ExpectNear(const char* what, const Tensor& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  double scale = 1e-30, max_diff = 0;
  int64_t worst = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double d = std::fabs(ElementAsDouble(got, i) - want[i]);
    if (!(d <= max_diff)) max_diff = d, worst = i;
  }
  EXPECT_LE(max_diff, tol * scale)
      << what << ": largest difference " << max_diff << " at element " << worst << " (got "
      << ElementAsDouble(got, worst) << ", want " << want[worst] << "), scale " << scale;
}

void RunConfig(const ConvConfig& c, DType dtype, int threads) {
  SCOPED_TRACE(StrCat("n=", c.n, " cin=", c.cin, " ", c.h, "x", c.w, " cout=", c.cout, " k=", c.kh,
                      "x", c.kw, " s=", c.sh, " p=", c.ph, " d=", c.dh, " g=", c.groups, " ",
                      DTypeName(dtype), " threads=", threads));
  const int saved = NumThreads();
  SetNumThreads(threads);
  Settings s;
  s.Set("num_output", c.cout).SetInts("kernel", {c.kh, c.kw}).SetInts("stride", {c.sh, c.sw});
  s.SetInts("pad", {c.ph, c.pw}).SetInts("dilation", {c.dh, c.dw}).Set("groups", c.groups);
  s.Set("bias", c.bias);
  LayerHarness h("Convolution", s, {RandomTensor({c.n, c.cin, c.h, c.w}, dtype, 1)});
  h.Forward();
  Tensor dy = RandomTensor(h.top()[0]->data.shape(), dtype, 2);
  h.Backward({dy});
  std::vector<double> y, dx, dw, db;
  Reference(c, ToVector(h.bottom()[0]->data), ToVector(h.layer().params()[0].value),
            c.bias ? ToVector(h.layer().params()[1].value) : std::vector<double>{}, ToVector(dy),
            &y, &dx, &dw, &db);
  const double tol = dtype == DType::kF64 ? 1e-12 : 2e-5;
  ExpectNear("output", h.top()[0]->data, y, tol);
  ExpectNear("input grad", h.bottom()[0]->grad, dx, tol);
  ExpectNear("weight grad", h.layer().params()[0].grad, dw, tol);
  if (c.bias) ExpectNear("bias grad", h.layer().params()[1].grad, db, tol);

  // Same inputs, same thread count: bitwise identical results.
  Tensor y0 = h.top()[0]->data.Clone(), dx0 = h.bottom()[0]->grad.Clone();
  Tensor dw0 = h.layer().params()[0].grad.Clone();
  h.Forward();
  h.Backward({dy});
  EXPECT_EQ(0, std::memcmp(y0.raw_data(), h.top()[0]->data.raw_data(), y0.nbytes()));
  EXPECT_EQ(0, std::memcmp(dx0.raw_data(), h.bottom()[0]->grad.raw_data(), dx0.nbytes()));
  EXPECT_EQ(0, std::memcmp(dw0.raw_data(), h.layer().params()[0].grad.raw_data(), dw0.nbytes()));
  SetNumThreads(saved);
}

const ConvConfig kConfigs[] = {
    // n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups, bias
    {9, 4, 7, 7, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},     // 49 positions: blocked
    {70, 3, 2, 2, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},    // 4 positions: 32-image blocks + rest
    {5, 6, 12, 11, 4, 3, 3, 2, 2, 1, 1, 1, 1, 2, false},  // stride 2, groups
    {6, 4, 6, 6, 6, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},     // 1x1 shortcut, blocked
    {3, 4, 24, 24, 6, 1, 1, 1, 1, 0, 0, 1, 1, 2, false},  // 1x1 shortcut, one image per GEMM
    {4, 3, 10, 9, 4, 3, 2, 2, 1, 2, 1, 2, 1, 1, true},    // rectangular, dilated, padded
    {3, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2, 1, 1, 1, true},   // LeNet's first layer
    {4, 3, 8, 7, 5, 3, 3, 1, 1, 0, 0, 1, 1, 1, true},     // stride 1, narrower output rows
    {3, 2, 6, 6, 3, 3, 3, 1, 1, 2, 1, 1, 1, 1, true},     // extra rows of padding only
    {2, 2, 9, 9, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1, true},     // dilated "same" convolution
    // Strided convolutions run on phase planes (the input split by coordinate mod stride).
    {40, 3, 8, 8, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1, true},   // ResNet downsampling, blocked
    {3, 2, 7, 7, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, true},    // odd input: a short phase
    {3, 4, 7, 8, 6, 1, 1, 2, 2, 0, 0, 1, 1, 1, false},   // 1x1 projection: 3 phases unread
    {3, 2, 11, 10, 4, 3, 3, 3, 2, 2, 1, 2, 1, 1, true},  // stride 3x2, dilated, padded
    {2, 3, 9, 9, 4, 2, 2, 3, 3, 1, 0, 1, 1, 1, true},    // stride > kernel: gaps
};

TEST(ConvolutionReference, MatchesDirectConvolution) {
  for (const ConvConfig& c : kConfigs) {
    for (int threads : {1, 2, 3}) RunConfig(c, DType::kF64, threads);
    RunConfig(c, DType::kF32, 2);
  }
}

TEST(ConvolutionReference, BatchesSmallOutputsIntoBlocks) {
  Settings s;
  s.Set("num_output", 4).Set("kernel", 3).Set("pad", 1);
  LayerHarness small("Convolution", s, {RandomTensor({4, 2, 7, 7}, DType::kF32, 3)});
  EXPECT_GT(static_cast<ConvolutionLayer&>(small.layer()).block_images(), 1);
  LayerHarness large("Convolution", s, {RandomTensor({2, 2, 28, 28}, DType::kF32, 3)});
  EXPECT_EQ(static_cast<ConvolutionLayer&>(large.layer()).block_images(), 1);
}

// A column budget smaller than one image's column matrix runs stride-1 convolutions in bands
// of output rows (one row, several, and a short last band), in f64, f32 and the 16-bit
// kernels, with the same results as the direct reference; strided, 1x1 and blocked ones are
// not banded.
TEST(ConvolutionReference, RunsLargeImagesInBandsOfRows) {
  const int64_t saved = ConvolutionLayer::column_budget();
  const ConvConfig banded[] = {
      // n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups, bias
      {3, 3, 24, 23, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},   // padded: bands at both edges
      {2, 4, 25, 22, 6, 3, 3, 1, 1, 2, 1, 2, 1, 2, false},  // dilated, groups
      {3, 2, 28, 26, 4, 5, 5, 1, 1, 0, 0, 1, 1, 1, true},   // no padding
  };
  for (int64_t budget : {int64_t{1}, int64_t{1000}, int64_t{3000}}) {
    ConvolutionLayer::SetColumnBudgetForTesting(budget);
    for (const ConvConfig& c : banded) {
      Settings s;
      s.Set("num_output", c.cout).SetInts("kernel", {c.kh, c.kw}).SetInts("dilation", {c.dh, c.dw});
      s.SetInts("pad", {c.ph, c.pw}).Set("groups", c.groups).Set("bias", c.bias);
      LayerHarness h("Convolution", s, {RandomTensor({c.n, c.cin, c.h, c.w}, DType::kF32, 1)});
      const auto& conv = static_cast<ConvolutionLayer&>(h.layer());
      const int64_t oh = OutSize(c.h, c.kh, c.sh, c.ph, c.dh);
      EXPECT_LT(conv.band_rows(), oh) << "budget " << budget;
      if (budget == 1) {
        EXPECT_EQ(conv.band_rows(), 1);
      }
      for (int threads : {1, 2}) RunConfig(c, DType::kF64, threads);
      RunConfig(c, DType::kF32, 2);
    }
  }
  // Only stride-1 convolutions that would use one image per GEMM with columns of their own.
  ConvolutionLayer::SetColumnBudgetForTesting(1);
  Settings strided;
  strided.Set("num_output", 4).Set("kernel", 3).Set("pad", 1).Set("stride", 2);
  LayerHarness s2("Convolution", strided, {RandomTensor({2, 2, 50, 50}, DType::kF32, 3)});
  EXPECT_EQ(static_cast<ConvolutionLayer&>(s2.layer()).band_rows(), 25);
  Settings pointwise;
  pointwise.Set("num_output", 4).Set("kernel", 1);
  LayerHarness p1("Convolution", pointwise, {RandomTensor({2, 2, 30, 30}, DType::kF32, 3)});
  EXPECT_EQ(static_cast<ConvolutionLayer&>(p1.layer()).band_rows(), 30);
  ConvolutionLayer::SetColumnBudgetForTesting(saved);
  // The default budget: VGG-16's second convolution (64 channels, 224x224) runs in bands of
  // 32 rows, 7168 columns each; its third (64 channels in, 112x112) in bands of 65 rows.
  Settings vgg;
  vgg.Set("num_output", 64).Set("kernel", 3).Set("pad", 1);
  LayerHarness conv1_2("Convolution", vgg, {RandomTensor({1, 64, 224, 224}, DType::kF32, 4)});
  EXPECT_EQ(static_cast<ConvolutionLayer&>(conv1_2.layer()).band_rows(), 32);
  LayerHarness conv2_1("Convolution", vgg, {RandomTensor({1, 64, 112, 112}, DType::kF32, 4)});
  EXPECT_EQ(static_cast<ConvolutionLayer&>(conv2_1.layer()).band_rows(), 65);
}

}  // namespace
}  // namespace cortado::testing
