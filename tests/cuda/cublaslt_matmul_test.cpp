// cuBLASLt's products (engine/cuda/cublaslt_matmul.h) run on a GPU against a plain f64 product.
// Labeled `cuda`; every test skips, saying why, where no GPU can be used.
//   - Small odd-sized products: every transpose pair with and without the bias, A^T B with the bias
//     gradient, every dtype pair, whole outputs checked.
//   - The inner products of LeNet, ResNet-20, ResNet-50 and VGG-16 at their training batch, as the
//     layer runs them (forward with bias, weight gradient with the bias gradient, input
//     gradient), 256 outputs and the whole bias gradient checked.
// Inputs are k/64 (exact in every dtype); tolerances are relative to the sum of the terms'
// magnitudes: 1e-5 for f32 outputs, one rounding for 16-bit ones.
#include "engine/cuda/cublaslt_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/tensor/device_runtime.h"
#include "tests/cuda/gpu_buffer.h"
#include "tests/support/net_shapes.h"

namespace cortado::cuda {
namespace {

using cortado::testing::FromBytes;
using cortado::testing::GpuBuffer;
using cortado::testing::SixtyFourths;
using cortado::testing::ToBytes;

class CublasLtOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!DeviceUsable(Device{DeviceType::kCUDA, 0}, &why)) GTEST_SKIP() << why;
  }
};

struct Math {
  DType in, out;
  bool tf32;
};
const Math kMaths[] = {{DType::kF32, DType::kF32, false},   {DType::kF32, DType::kF32, true},
                       {DType::kF16, DType::kF16, false},   {DType::kF16, DType::kF32, false},
                       {DType::kBF16, DType::kBF16, false}, {DType::kBF16, DType::kF32, false}};

double Tolerance(DType out) {
  return out == DType::kF32 ? 1e-5 : out == DType::kF16 ? 1.0 / 1024 : 1.0 / 128;
}

// Row-major A (m x k, or k x m when transposed) and B alike, as the case describes them.
struct Operands {
  std::vector<double> a, b, bias;
  double OpA(const MatmulCase& c, int64_t i, int64_t l) const {
    return c.transpose_a ? a[l * c.m + i] : a[i * c.k + l];
  }
  double OpB(const MatmulCase& c, int64_t l, int64_t j) const {
    return c.transpose_b ? b[j * c.k + l] : b[l * c.n + j];
  }
};

// One product on the GPU with its inputs uploaded; outputs read back on demand.
struct GpuProduct {
  GpuProduct(const MatmulCase& c, const Operands& ops)
      : a(ops.a.size() * DTypeSize(c.dtype)),
        b(ops.b.size() * DTypeSize(c.dtype)),
        out(c.m * c.n * DTypeSize(c.out_dtype)),
        vector((c.epilogue == MatmulEpilogue::kBias ? c.n : c.m) * DTypeSize(c.out_dtype)) {
    const std::vector<uint8_t> a_bytes = ToBytes(ops.a, c.dtype);
    const std::vector<uint8_t> b_bytes = ToBytes(ops.b, c.dtype);
    a.Upload(a_bytes.data(), a_bytes.size());
    b.Upload(b_bytes.data(), b_bytes.size());
    if (c.epilogue == MatmulEpilogue::kBias) {
      const std::vector<uint8_t> bias = ToBytes(ops.bias, c.out_dtype);
      vector.Upload(bias.data(), bias.size());
    }
    out.Fill(c.out_dtype, c.m * c.n, -1.0);  // every output must be written
    MatmulTensors t{.a = a.get(), .b = b.get(), .c = out.get()};
    if (c.epilogue == MatmulEpilogue::kBias) t.bias = vector.get();
    if (c.epilogue == MatmulEpilogue::kBiasGradient) t.bias_grad = vector.get();
    RunMatmul(0, c, t);
    GpuBuffer::Sync();
  }
  static double Read(const GpuBuffer& buffer, DType dtype, int64_t index) {
    std::vector<uint8_t> bytes(DTypeSize(dtype));
    buffer.Download(bytes.data(), bytes.size(), index * bytes.size());
    return FromBytes(bytes, dtype)[0];
  }
  GpuBuffer a, b, out, vector;
};

// Checks C[i][j] (and bias_grad[i] for each i in `rows`) against the f64 product.
void CheckOutputs(const MatmulCase& c, const Operands& ops, const GpuProduct& gpu,
                  const std::vector<std::pair<int64_t, int64_t>>& elements) {
  const double tolerance = Tolerance(c.out_dtype);
  int bad = 0;
  for (const auto& [i, j] : elements) {
    double want = 0, scale = 0;
    for (int64_t l = 0; l < c.k; ++l) {
      want += ops.OpA(c, i, l) * ops.OpB(c, l, j);
      scale += std::abs(ops.OpA(c, i, l) * ops.OpB(c, l, j));
    }
    if (c.epilogue == MatmulEpilogue::kBias) {
      want += ops.bias[j];
      scale += std::abs(ops.bias[j]);
    }
    const double got = GpuProduct::Read(gpu.out, c.out_dtype, i * c.n + j);
    if (!(std::abs(got - want) <= tolerance * scale + 1e-30) && ++bad <= 5) {
      ADD_FAILURE() << "C[" << i << "][" << j << "] = " << got << ", want " << want;
    }
  }
  if (c.epilogue == MatmulEpilogue::kBiasGradient) {
    std::vector<uint8_t> bytes(c.m * DTypeSize(c.out_dtype));
    gpu.vector.Download(bytes.data(), bytes.size());
    const std::vector<double> got = FromBytes(bytes, c.out_dtype);
    for (int64_t i = 0; i < c.m; ++i) {
      double want = 0, scale = 0;
      for (int64_t l = 0; l < c.k; ++l) {
        want += ops.OpA(c, i, l);
        scale += std::abs(ops.OpA(c, i, l));
      }
      if (!(std::abs(got[i] - want) <= tolerance * scale + 1e-30) && ++bad <= 5) {
        ADD_FAILURE() << "bias_grad[" << i << "] = " << got[i] << ", want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(CublasLtOnGpu, SmallProductsMatchTheDefinitionForEveryTransposeEpilogueAndDtype) {
  std::mt19937 rng(5);
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{37, 29, 53}, {64, 48, 32}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Operands ops{SixtyFourths(m * k, rng), SixtyFourths(k * n, rng), SixtyFourths(n, rng)};
        for (MatmulEpilogue epilogue :
             {MatmulEpilogue::kNone, MatmulEpilogue::kBias, MatmulEpilogue::kBiasGradient}) {
          // The bias gradient is fused into A^T B alone (CheckMatmulCase).
          if (epilogue == MatmulEpilogue::kBiasGradient && (!ta || tb)) continue;
          for (const Math& math : kMaths) {
            const MatmulCase c{.m = m,
                               .n = n,
                               .k = k,
                               .transpose_a = ta,
                               .transpose_b = tb,
                               .dtype = math.in,
                               .out_dtype = math.out,
                               .allow_tf32 = math.tf32,
                               .epilogue = epilogue};
            SCOPED_TRACE(MatmulKey(c));
            const GpuProduct gpu(c, ops);
            std::vector<std::pair<int64_t, int64_t>> all;
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) all.emplace_back(i, j);
            CheckOutputs(c, ops, gpu, all);
          }
        }
      }
    }
  }
}

TEST_F(CublasLtOnGpu, EveryNetInnerProductRunsAtItsTrainingBatch) {
  std::mt19937 rng(11);
  for (const cortado::testing::TrainedNet& net : cortado::testing::TrainedNets()) {
    for (const cortado::testing::NetInnerProduct& ip : cortado::testing::InnerProductsOf(net)) {
      const int64_t batch = ip.batch, in = ip.inputs, out = ip.outputs;
      const std::vector<double> x = SixtyFourths(batch * in, rng);
      const std::vector<double> w = SixtyFourths(out * in, rng);
      const std::vector<double> dy = SixtyFourths(batch * out, rng);
      const std::vector<double> bias = SixtyFourths(out, rng);
      struct Product {
        MatmulCase c;
        Operands ops;
      };
      const Product products[] = {
          {{.m = batch, .n = out, .k = in, .transpose_b = true, .epilogue = MatmulEpilogue::kBias},
           {x, w, bias}},
          {{.m = out,
            .n = in,
            .k = batch,
            .transpose_a = true,
            .epilogue = MatmulEpilogue::kBiasGradient},
           {dy, x, {}}},
          {{.m = batch, .n = in, .k = out}, {dy, w, {}}}};
      for (const Product& product : products) {
        for (const Math& math : kMaths) {
          MatmulCase c = product.c;
          c.dtype = math.in, c.out_dtype = math.out, c.allow_tf32 = math.tf32;
          SCOPED_TRACE(ip.net + " " + ip.layer + ": " + MatmulKey(c));
          const GpuProduct gpu(c, product.ops);
          std::vector<std::pair<int64_t, int64_t>> sample = {{0, 0}, {c.m - 1, c.n - 1}};
          std::uniform_int_distribution<int64_t> row(0, c.m - 1), col(0, c.n - 1);
          while (sample.size() < 256) sample.emplace_back(row(rng), col(rng));
          CheckOutputs(c, product.ops, gpu, sample);
        }
      }
    }
  }
}

}  // namespace
}  // namespace cortado::cuda
