// cuDNN's convolutions (engine/cuda/cudnn_conv.h) run on a GPU against a plain reference.
// Labeled `cuda`; every test skips, saying why, where no GPU can be used.
//   - Small geometries (padding, stride, dilation, groups, depthwise, 1x1, 7x7, odd channel
//     counts) with random values, every pass, format and dtype, against the f64 convolution
//     written out below (the definition nn.Conv2d and layers/conv.cpp compute).
//   - Every convolution of LeNet, ResNet-20, ResNet-50 and VGG-16 at the batch it trains at, with
//     constant inputs: every output is a count of the kernel taps that land inside the padded
//     input (times the constants), known exactly, so the plans the nets will use are run at their
//     real sizes and checked whole.
//   - The GPU's device properties, recorded (test_cuda.json) so that the host tests' modeled H100
//     can be compared with a real one.
#include "engine/cuda/cudnn_conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/tensor/device_runtime.h"
#include "tests/cuda/gpu_buffer.h"
#include "tests/support/conv_geometries.h"
#include "tests/support/net_shapes.h"

namespace cortado::cuda {
namespace {

using cortado::testing::FromBytes;
using cortado::testing::GpuBuffer;
using cortado::testing::RoundTo;
using cortado::testing::ToBytes;

const Device kGpu{DeviceType::kCUDA, 0};

class CudnnOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!DeviceUsable(kGpu, &why)) GTEST_SKIP() << why;
  }
};

struct Math {
  const char* name;
  DType dtype;
  bool tf32;
  ConvFormat format, filter_format;
  double tolerance;  // of an output, relative to the sum of its terms' magnitudes
};
// f32 accumulates exactly enough for 1e-5 (Winograd and FFT engines included); 16-bit outputs
// are rounded once (2^-11 and 2^-8 of the value), the inputs (k/64) being exact in every dtype.
const Math kMaths[] = {
    {"f32 NCHW", DType::kF32, false, ConvFormat::kNCHW, ConvFormat::kNCHW, 1e-5},
    {"f32 NHWC", DType::kF32, false, ConvFormat::kNHWC, ConvFormat::kNHWC, 1e-5},
    {"TF32 NHWC", DType::kF32, true, ConvFormat::kNHWC, ConvFormat::kNHWC, 1e-5},
    {"f16 NHWC", DType::kF16, false, ConvFormat::kNHWC, ConvFormat::kNHWC, 1.0 / 1024},
    {"bf16 NHWC", DType::kBF16, false, ConvFormat::kNHWC, ConvFormat::kNHWC, 1.0 / 128},
    {"f16 NHWC, OIHW filter", DType::kF16, false, ConvFormat::kNHWC, ConvFormat::kNCHW,
     1.0 / 1024}};

ConvCase CaseOf(const ConvGeometry& g, const Math& m, ConvPass pass) {
  ConvCase c;
  c.geometry = g;
  c.dtype = m.dtype, c.allow_tf32 = m.tf32;
  c.format = m.format, c.filter_format = m.filter_format;
  c.pass = pass;
  return c;
}

int64_t Count(const std::array<int64_t, 4>& dims) { return dims[0] * dims[1] * dims[2] * dims[3]; }

// Logical (N, C, H, W)-ordered values to memory order by `strides`, and back.
std::vector<double> ToMemory(const std::vector<double>& logical, const ConvTensorLayout& t) {
  std::vector<double> memory(logical.size());
  const auto& [d0, d1, d2, d3] = t.dims;
  int64_t i = 0;
  for (int64_t a = 0; a < d0; ++a)
    for (int64_t b = 0; b < d1; ++b)
      for (int64_t c = 0; c < d2; ++c)
        for (int64_t d = 0; d < d3; ++d) {
          memory[a * t.strides[0] + b * t.strides[1] + c * t.strides[2] + d * t.strides[3]] =
              logical[i++];
        }
  return memory;
}

std::vector<double> FromMemory(const std::vector<double>& memory, const ConvTensorLayout& t) {
  std::vector<double> logical(memory.size());
  const auto& [d0, d1, d2, d3] = t.dims;
  int64_t i = 0;
  for (int64_t a = 0; a < d0; ++a)
    for (int64_t b = 0; b < d1; ++b)
      for (int64_t c = 0; c < d2; ++c)
        for (int64_t d = 0; d < d3; ++d) {
          logical[i++] =
              memory[a * t.strides[0] + b * t.strides[1] + c * t.strides[2] + d * t.strides[3]];
        }
  return logical;
}

// The definition, in f64 on logical (N, C, H, W) arrays: y = conv(x, w), dx = conv^T(dy, w),
// dw = corr(x, dy); with the sums of the terms' magnitudes (the tolerances' scale).
struct Reference {
  std::vector<double> y, dx, dw, y_abs, dx_abs, dw_abs;
};

Reference Convolve(const ConvGeometry& g, const std::vector<double>& x,
                   const std::vector<double>& w, const std::vector<double>& dy) {
  const int64_t p_size = g.out_h(), q_size = g.out_w();
  const int64_t cg = g.c / g.groups, kg = g.k / g.groups;
  Reference r;
  r.y.assign(g.n * g.k * p_size * q_size, 0.0);
  r.y_abs = r.y;
  r.dx.assign(x.size(), 0.0);
  r.dx_abs = r.dx;
  r.dw.assign(w.size(), 0.0);
  r.dw_abs = r.dw;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t k = 0; k < g.k; ++k)
      for (int64_t p = 0; p < p_size; ++p)
        for (int64_t q = 0; q < q_size; ++q) {
          const int64_t yi = ((n * g.k + k) * p_size + p) * q_size + q;
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t c = (k / kg) * cg + ci;
            for (int64_t kr = 0; kr < g.kh; ++kr) {
              const int64_t h = p * g.stride_h - g.pad_h + kr * g.dilation_h;
              if (h < 0 || h >= g.h) continue;
              for (int64_t ks = 0; ks < g.kw; ++ks) {
                const int64_t col = q * g.stride_w - g.pad_w + ks * g.dilation_w;
                if (col < 0 || col >= g.w) continue;
                const int64_t xi = ((n * g.c + c) * g.h + h) * g.w + col;
                const int64_t wi = ((k * cg + ci) * g.kh + kr) * g.kw + ks;
                r.y[yi] += x[xi] * w[wi];
                r.y_abs[yi] += std::abs(x[xi] * w[wi]);
                r.dx[xi] += dy[yi] * w[wi];
                r.dx_abs[xi] += std::abs(dy[yi] * w[wi]);
                r.dw[wi] += x[xi] * dy[yi];
                r.dw_abs[wi] += std::abs(x[xi] * dy[yi]);
              }
            }
          }
        }
  return r;
}

// Runs `c` on the GPU from logical x, w and y (dy) and returns its output, logical.
std::vector<double> RunOnGpu(const ConvCase& c, const std::vector<double>& x,
                             const std::vector<double>& w, const std::vector<double>& y) {
  const std::array<ConvTensorLayout, 3> layouts = ConvTensorLayouts(c);
  const std::vector<double>* values[3] = {&x, &w, &y};
  std::vector<std::unique_ptr<GpuBuffer>> buffers;
  for (int i = 0; i < 3; ++i) {
    const std::vector<uint8_t> bytes = ToBytes(ToMemory(*values[i], layouts[i]), c.dtype);
    buffers.push_back(std::make_unique<GpuBuffer>(bytes.size()));
    buffers.back()->Upload(bytes.data(), bytes.size());
  }
  RunConvolution(0, c, {buffers[0]->get(), buffers[1]->get(), buffers[2]->get()});
  const int out = c.pass == ConvPass::kForward ? 2 : c.pass == ConvPass::kBackwardData ? 0 : 1;
  std::vector<uint8_t> bytes(buffers[out]->bytes());
  buffers[out]->Download(bytes.data(), bytes.size());
  return FromMemory(FromBytes(bytes, c.dtype), layouts[out]);
}

TEST_F(CudnnOnGpu, SmallConvolutionsMatchTheDefinitionInEveryPassFormatAndDtype) {
  std::vector<ConvGeometry> shapes = {
      {.n = 2, .c = 8, .h = 9, .w = 7, .k = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 3,
       .c = 16,
       .h = 11,
       .w = 10,
       .k = 8,
       .kh = 3,
       .kw = 3,
       .stride_h = 2,
       .stride_w = 2,
       .pad_h = 1,
       .pad_w = 1},
      {.n = 2, .c = 16, .h = 8, .w = 8, .k = 32, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2},
      {.n = 2,
       .c = 3,
       .h = 23,
       .w = 21,
       .k = 8,
       .kh = 7,
       .kw = 7,
       .stride_h = 2,
       .stride_w = 2,
       .pad_h = 3,
       .pad_w = 3},
      {.n = 2, .c = 1, .h = 12, .w = 12, .k = 8, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}};
  for (const ConvGeometry& g : cortado::testing::UnusualConvolutions()) shapes.push_back(g);
  std::mt19937 rng(42);
  for (const ConvGeometry& g : shapes) {
    ConvCase logical;
    logical.geometry = g;
    const std::array<ConvTensorLayout, 3> layouts = ConvTensorLayouts(logical);
    const std::vector<double> x = cortado::testing::SixtyFourths(Count(layouts[0].dims), rng);
    const std::vector<double> w = cortado::testing::SixtyFourths(Count(layouts[1].dims), rng);
    const std::vector<double> dy = cortado::testing::SixtyFourths(Count(layouts[2].dims), rng);
    const Reference want = Convolve(g, x, w, dy);
    for (const Math& m : kMaths) {
      for (ConvPass pass :
           {ConvPass::kForward, ConvPass::kBackwardData, ConvPass::kBackwardFilter}) {
        const ConvCase c = CaseOf(g, m, pass);
        SCOPED_TRACE(ConvKey(c));
        const std::vector<double> got = RunOnGpu(c, x, w, dy);
        const std::vector<double>& value = pass == ConvPass::kForward        ? want.y
                                           : pass == ConvPass::kBackwardData ? want.dx
                                                                             : want.dw;
        const std::vector<double>& scale = pass == ConvPass::kForward        ? want.y_abs
                                           : pass == ConvPass::kBackwardData ? want.dx_abs
                                                                             : want.dw_abs;
        ASSERT_EQ(got.size(), value.size());
        int64_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          if (!(std::abs(got[i] - value[i]) <= m.tolerance * scale[i] + 1e-30)) {
            if (++bad <= 5) {
              ADD_FAILURE() << "element " << i << ": " << got[i] << ", want " << value[i]
                            << " (terms' magnitude " << scale[i] << ")";
            }
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

// Along one axis, for each position of the pass's output, how many (output position, tap) pairs
// of the convolution meet there with the tap inside [0, in): per output position (forward), per
// input position (backward data), per tap (backward filter). With constant inputs an output is
// the product of its two axes' counts, the summed channels (forward), output channels (backward
// data) or images (backward filter), and the two constants.
std::vector<int64_t> AxisCounts(ConvPass pass, int64_t in, int64_t out, int64_t kernel,
                                int64_t stride, int64_t pad, int64_t dilation) {
  std::vector<int64_t> counts(pass == ConvPass::kForward        ? out
                              : pass == ConvPass::kBackwardData ? in
                                                                : kernel,
                              0);
  for (int64_t p = 0; p < out; ++p) {
    for (int64_t r = 0; r < kernel; ++r) {
      const int64_t h = p * stride - pad + r * dilation;
      if (h < 0 || h >= in) continue;
      ++counts[pass == ConvPass::kForward ? p : pass == ConvPass::kBackwardData ? h : r];
    }
  }
  return counts;
}

TEST_F(CudnnOnGpu, EveryNetConvolutionRunsAtItsTrainingBatchOnConstantInputs) {
  // Every input 1/16: products 1/256, sums of up to 2^24 of them exact in f32, and every result
  // within f16's range (ResNet-50's conv1 filter gradient: 256 x 112 x 112 / 256 = 12544).
  const double v = 1.0 / 16;
  const std::vector<cortado::testing::NetConvolution> convs =
      cortado::testing::DistinctNetConvolutions();
  size_t largest[3] = {0, 0, 0};
  for (const cortado::testing::NetConvolution& conv : convs) {
    ConvCase c;
    c.geometry = conv.geometry;
    const std::array<ConvTensorLayout, 3> t = ConvTensorLayouts(c);
    for (int i = 0; i < 3; ++i) largest[i] = std::max<size_t>(largest[i], Count(t[i].dims) * 4);
  }
  GpuBuffer x(largest[0]), w(largest[1]), y(largest[2]);
  int runs = 0;
  for (const cortado::testing::NetConvolution& conv : convs) {
    const ConvGeometry& g = conv.geometry;
    const int64_t p_size = g.out_h(), q_size = g.out_w();
    for (const Math& m : kMaths) {
      for (ConvPass pass :
           {ConvPass::kForward, ConvPass::kBackwardData, ConvPass::kBackwardFilter}) {
        const ConvCase c = CaseOf(g, m, pass);
        SCOPED_TRACE(conv.net + " " + conv.layer + ": " + ConvKey(c));
        const std::array<ConvTensorLayout, 3> t = ConvTensorLayouts(c);
        GpuBuffer* buffers[3] = {&x, &w, &y};
        const int out = pass == ConvPass::kForward ? 2 : pass == ConvPass::kBackwardData ? 0 : 1;
        for (int i = 0; i < 3; ++i) {
          if (i != out) buffers[i]->Fill(m.dtype, Count(t[i].dims), v);
        }
        buffers[out]->Fill(m.dtype, Count(t[out].dims), -1.0);  // every output must be written
        ASSERT_NO_THROW(RunConvolution(0, c, {x.get(), w.get(), y.get()}));
        ++runs;
        // The whole filter gradient; of x and y the first and the last image (N is outermost in
        // both formats, so each is one contiguous block).
        const std::array<int64_t, 4>& dims = t[out].dims;
        const int64_t image = dims[1] * dims[2] * dims[3];
        std::vector<int64_t> images = {0};
        if (out != 1 && dims[0] > 1) images.push_back(dims[0] - 1);
        const int64_t block = out == 1 ? Count(dims) : image;
        const std::vector<int64_t> rows =
            AxisCounts(pass, g.h, p_size, g.kh, g.stride_h, g.pad_h, g.dilation_h);
        const std::vector<int64_t> cols =
            AxisCounts(pass, g.w, q_size, g.kw, g.stride_w, g.pad_w, g.dilation_w);
        const int64_t summed = pass == ConvPass::kForward        ? g.c / g.groups
                               : pass == ConvPass::kBackwardData ? g.k / g.groups
                                                                 : g.n;
        std::vector<double> wants(dims[2] * dims[3]);  // by (row, column), rounded as the output
        for (int64_t r = 0; r < dims[2]; ++r) {
          for (int64_t q = 0; q < dims[3]; ++q) {
            wants[r * dims[3] + q] =
                RoundTo(static_cast<double>(summed * rows[r] * cols[q]) * v * v, m.dtype);
          }
        }
        int64_t bad = 0;
        for (int64_t first : images) {
          std::vector<uint8_t> bytes(block * DTypeSize(m.dtype));
          buffers[out]->Download(bytes.data(), bytes.size(), first * image * DTypeSize(m.dtype));
          const std::vector<double> got = FromBytes(bytes, m.dtype);
          for (int64_t i = 0; i < block; ++i) {
            // Row and column of element i: in a dense layout, index d is offset / stride_d mod
            // dim_d (the slices start at whole images, so the outermost dimension drops out).
            const int64_t hh = i / t[out].strides[2] % dims[2];
            const int64_t ww = i / t[out].strides[3] % dims[3];
            const double want = wants[hh * dims[3] + ww];
            if (!(std::abs(got[i] - want) <= m.tolerance * std::abs(want))) {
              if (++bad <= 5) {
                ADD_FAILURE() << "image " << first << " element " << i << ": " << got[i]
                              << ", want " << want;
              }
            }
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
  RecordProperty("runs", runs);
}

TEST_F(CudnnOnGpu, TheGpusPropertiesAreRecordedAndPlanAsTheyDoFromJson) {
  const CudnnDescriptor properties = DevicePropertiesOf(CudaContext::Get(0).cudnn());
  const std::string json = DevicePropertiesJson(properties);
  RecordProperty("cudnn_device_properties", json);
  RecordProperty("gpu", RuntimeFor(kGpu).Describe(0));
  // The same GPU read back from its JSON (what the host tests do with the modeled H100) plans a
  // case with the same engine.
  ConvPlanCache from_gpu(DevicePropertiesOf(CudaContext::Get(0).cudnn()));
  ConvPlanCache from_json(DevicePropertiesFromJson(json));
  ConvCase c;
  c.geometry = {
      .n = 64, .c = 64, .h = 56, .w = 56, .k = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
  c.dtype = DType::kF16;
  EXPECT_EQ(from_gpu.Get(c).plan.engine, from_json.Get(c).plan.engine);
  RecordProperty("f16_3x3_engine", from_gpu.Get(c).plan.Describe());
}

}  // namespace
}  // namespace cortado::cuda
