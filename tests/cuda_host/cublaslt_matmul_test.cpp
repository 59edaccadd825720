// The cuBLASLt products (engine/cuda/cublaslt_matmul.h) as far as a machine without a GPU can
// check them: the row-major to column-major mapping against a plain column-major reference that
// reads the matrices exactly as cuBLASLt is told to (so transposes, leading dimensions and the
// epilogues' vectors are right), the key, and the descriptors and layouts of every inner product
// of LeNet, ResNet-20, ResNet-50 and VGG-16, read back through cuBLASLt's own getters. cuBLASLt
// creates and fills descriptors without a GPU but validates little there (a leading dimension
// smaller than the rows is accepted); its handle and heuristics need the device (test_cuda).
#include "engine/cuda/cublaslt_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/cuda/cuda_libraries.h"
#include "tests/support/errors.h"
#include "tests/support/net_shapes.h"

namespace cortado::cuda {
namespace {

using cortado::testing::ErrorOf;

// The inner product layer's three products for x (batch x in), W (out x in).
MatmulCase Forward(int64_t batch, int64_t in, int64_t out) {
  return {.m = batch, .n = out, .k = in, .transpose_b = true, .epilogue = MatmulEpilogue::kBias};
}
MatmulCase WeightGrad(int64_t batch, int64_t in, int64_t out) {
  return {.m = out,
          .n = in,
          .k = batch,
          .transpose_a = true,
          .epilogue = MatmulEpilogue::kBiasGradient};
}
MatmulCase InputGrad(int64_t batch, int64_t in, int64_t out) {
  return {.m = batch, .n = in, .k = out};
}

TEST(LtOperands, TheInnerProductsProductsInCublasLtsTerms) {
  // ResNet-50's classifier: x (256 x 2048), W (1000 x 2048).
  const LtOperands forward = LtOperandsOf(Forward(256, 2048, 1000));
  EXPECT_EQ(forward.a, (LtMatrix{2048, 1000, 2048, true}));  // W, stored (1000 x 2048)
  EXPECT_EQ(forward.b, (LtMatrix{2048, 256, 2048, false}));  // x, stored (256 x 2048)
  EXPECT_EQ(forward.d, (LtMatrix{1000, 256, 1000, false}));  // y^T: bias along its rows
  const LtOperands weight_grad = LtOperandsOf(WeightGrad(256, 2048, 1000));
  EXPECT_EQ(weight_grad.a, (LtMatrix{2048, 256, 2048, false}));  // x
  EXPECT_EQ(weight_grad.b, (LtMatrix{1000, 256, 1000, true}));   // dy, stored (256 x 1000)
  EXPECT_EQ(weight_grad.d, (LtMatrix{2048, 1000, 2048, false}));
  const LtOperands input_grad = LtOperandsOf(InputGrad(256, 2048, 1000));
  EXPECT_EQ(input_grad.a, (LtMatrix{2048, 1000, 2048, false}));  // W
  EXPECT_EQ(input_grad.b, (LtMatrix{1000, 256, 1000, false}));   // dy
  EXPECT_EQ(input_grad.d, (LtMatrix{2048, 256, 2048, false}));
}

// op(M)(i, j) of a column-major stored matrix as cuBLASLt reads it.
double OpElement(const LtMatrix& m, const std::vector<double>& data, int64_t i, int64_t j) {
  return m.transposed ? data[i * m.ld + j] : data[j * m.ld + i];
}

TEST(LtOperands, ACublasLtProductOfTheMappedOperandsIsTheRowMajorProduct) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> uniform(-1, 1);
  const int64_t m = 3, n = 5, k = 4;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (MatmulEpilogue epilogue :
           {MatmulEpilogue::kNone, MatmulEpilogue::kBias, MatmulEpilogue::kBiasGradient}) {
        const MatmulCase c{
            .m = m, .n = n, .k = k, .transpose_a = ta, .transpose_b = tb, .epilogue = epilogue};
        SCOPED_TRACE(MatmulKey(c));
        // Row-major storage: A is (m x k), or (k x m) when transposed; B alike.
        std::vector<double> a(m * k), b(k * n), bias(n);
        for (double& v : a) v = uniform(rng);
        for (double& v : b) v = uniform(rng);
        for (double& v : bias) v = uniform(rng);
        auto op_a = [&](int64_t i, int64_t l) { return ta ? a[l * m + i] : a[i * k + l]; };
        auto op_b = [&](int64_t l, int64_t j) { return tb ? b[j * k + l] : b[l * n + j]; };
        // What the layer wants, row-major.
        std::vector<double> want(m * n, 0.0), want_grad(m, 0.0);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t l = 0; l < k; ++l) want[i * n + j] += op_a(i, l) * op_b(l, j);
            if (epilogue == MatmulEpilogue::kBias) want[i * n + j] += bias[j];
          }
          for (int64_t l = 0; l < k; ++l) want_grad[i] += op_a(i, l);
        }
        // What cuBLASLt computes: D = op(LA) op(LB), LA at our B's pointer and LB at our A's,
        // with BIAS along D's rows and BGRADB summing op(LB) over k, for each of D's columns.
        const LtOperands ops = LtOperandsOf(c);
        const int64_t lt_k = ops.a.transposed ? ops.a.rows : ops.a.cols;
        ASSERT_EQ(lt_k, k);
        ASSERT_EQ(ops.b.transposed ? ops.b.cols : ops.b.rows, k);
        std::vector<double> d(ops.d.ld * ops.d.cols, 0.0), grad(ops.d.cols, 0.0);
        for (int64_t i = 0; i < ops.d.rows; ++i) {
          for (int64_t j = 0; j < ops.d.cols; ++j) {
            double sum = 0;
            for (int64_t l = 0; l < lt_k; ++l) {
              sum += OpElement(ops.a, b, i, l) * OpElement(ops.b, a, l, j);
            }
            if (epilogue == MatmulEpilogue::kBias) sum += bias[i];
            d[j * ops.d.ld + i] = sum;
          }
        }
        for (int64_t j = 0; j < ops.d.cols; ++j) {
          for (int64_t l = 0; l < lt_k; ++l) grad[j] += OpElement(ops.b, a, l, j);
        }
        for (int64_t i = 0; i < m * n; ++i) EXPECT_NEAR(d[i], want[i], 1e-12) << "element " << i;
        if (epilogue == MatmulEpilogue::kBiasGradient) {
          for (int64_t i = 0; i < m; ++i) EXPECT_NEAR(grad[i], want_grad[i], 1e-12) << i;
        }
      }
    }
  }
}

TEST(MatmulKey, NamesTheProduct) {
  MatmulCase c = Forward(256, 2048, 1000);
  c.dtype = c.out_dtype = DType::kF16;
  EXPECT_EQ(MatmulKey(c), "C (256 x 1000) = A (256 x 2048) B^T (2048 x 1000), f16 -> f16, bias");
  c = WeightGrad(256, 2048, 1000);
  c.allow_tf32 = true;
  EXPECT_EQ(MatmulKey(c),
            "C (1000 x 2048) = A^T (1000 x 256) B (256 x 2048), f32 (TF32 allowed) -> f32, bias "
            "gradient");
  MatmulCase bf16 = c;
  bf16.dtype = DType::kBF16;
  MatmulCase bf16_tf32 = bf16;
  bf16_tf32.allow_tf32 = false;
  EXPECT_EQ(MatmulKey(bf16), MatmulKey(bf16_tf32));  // TF32 is f32's alone
  EXPECT_NE(MatmulKey(bf16), MatmulKey(c));
}

TEST(MatmulKey, RefusesWhatCublasLtDoesNotMultiply) {
  MatmulCase c = InputGrad(4, 8, 2);
  c.out_dtype = DType::kF16;  // f32 inputs, f16 output
  EXPECT_NE(ErrorOf([&] { CheckMatmulCase(c); })
                .find("matmul C (4 x 8) = A (4 x 2) B (2 x 8), f32 -> f16: the output is f32 or "
                      "the inputs' dtype"),
            std::string::npos);
  c.dtype = DType::kBF16;
  EXPECT_NE(ErrorOf([&] { CheckMatmulCase(c); }).find("the output is f32"), std::string::npos);
  c.dtype = DType::kF64, c.out_dtype = DType::kF64;
  EXPECT_NE(ErrorOf([&] {
              CheckMatmulCase(c);
            }).find("cuBLASLt products take f32, f16 or bf16 matrices, not f64"),
            std::string::npos);
  c = WeightGrad(4, 8, 2);
  EXPECT_EQ(ErrorOf([&] { CheckMatmulCase(c); }), "");
  c.transpose_b = true;
  EXPECT_NE(ErrorOf([&] {
              CheckMatmulCase(c);
            }).find("bias gradient: the bias gradient is fused into A^T B products only"),
            std::string::npos);
  c.transpose_a = c.transpose_b = false;
  EXPECT_NE(ErrorOf([&] { CheckMatmulCase(c); }).find("A^T B products only"), std::string::npos);
  c = InputGrad(0, 8, 2);
  EXPECT_NE(ErrorOf([&] { MatmulDescriptors d(c); }).find("sizes must be positive"),
            std::string::npos);
}

template <typename T>
T DescAttribute(const MatmulDescriptors& d, cublasLtMatmulDescAttributes_t attribute) {
  T value{};
  size_t written = 0;
  EXPECT_EQ(Libraries().cublasLtMatmulDescGetAttribute(d.op(), attribute, &value, sizeof(value),
                                                       &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(value));
  return value;
}

struct ReadLayout {
  int32_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t order;
};

ReadLayout Read(cublasLtMatrixLayout_t layout) {
  ReadLayout r{};
  auto get = [&](cublasLtMatrixLayoutAttribute_t attribute, auto* value) {
    size_t written = 0;
    EXPECT_EQ(Libraries().cublasLtMatrixLayoutGetAttribute(layout, attribute, value, sizeof(*value),
                                                           &written),
              CUBLAS_STATUS_SUCCESS);
  };
  get(CUBLASLT_MATRIX_LAYOUT_TYPE, &r.type);
  get(CUBLASLT_MATRIX_LAYOUT_ROWS, &r.rows);
  get(CUBLASLT_MATRIX_LAYOUT_COLS, &r.cols);
  get(CUBLASLT_MATRIX_LAYOUT_LD, &r.ld);
  get(CUBLASLT_MATRIX_LAYOUT_ORDER, &r.order);
  return r;
}

void ExpectLayout(cublasLtMatrixLayout_t layout, cudaDataType_t type, const LtMatrix& m,
                  const char* which) {
  const ReadLayout r = Read(layout);
  EXPECT_EQ(r.type, type) << which;
  EXPECT_EQ(r.rows, static_cast<uint64_t>(m.rows)) << which;
  EXPECT_EQ(r.cols, static_cast<uint64_t>(m.cols)) << which;
  EXPECT_EQ(r.ld, m.ld) << which;
  EXPECT_EQ(r.order, CUBLASLT_ORDER_COL) << which;
}

TEST(CublasLtOnHost, EveryNetInnerProductsDescriptorsSayWhatTheCaseAsks) {
  struct Math {
    DType in, out;
    bool tf32;
    cudaDataType_t in_type, out_type;
    cublasComputeType_t compute;
  };
  const Math maths[] = {
      {DType::kF32, DType::kF32, false, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
      {DType::kF32, DType::kF32, true, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
      {DType::kF16, DType::kF16, false, CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F},
      {DType::kF16, DType::kF32, false, CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
      {DType::kBF16, DType::kBF16, true, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
      {DType::kBF16, DType::kF32, false, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F}};
  int products = 0;
  for (const cortado::testing::TrainedNet& net : cortado::testing::TrainedNets()) {
    for (const cortado::testing::NetInnerProduct& ip : cortado::testing::InnerProductsOf(net)) {
      for (MatmulCase c :
           {Forward(ip.batch, ip.inputs, ip.outputs), WeightGrad(ip.batch, ip.inputs, ip.outputs),
            InputGrad(ip.batch, ip.inputs, ip.outputs)}) {
        for (const Math& math : maths) {
          c.dtype = math.in, c.out_dtype = math.out, c.allow_tf32 = math.tf32;
          SCOPED_TRACE(ip.net + " " + ip.layer + ": " + MatmulKey(c));
          const MatmulDescriptors d(c);
          const LtOperands ops = LtOperandsOf(c);
          EXPECT_EQ(DescAttribute<int32_t>(d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE), math.compute);
          EXPECT_EQ(DescAttribute<int32_t>(d, CUBLASLT_MATMUL_DESC_SCALE_TYPE), CUDA_R_32F);
          EXPECT_EQ(DescAttribute<int32_t>(d, CUBLASLT_MATMUL_DESC_TRANSA),
                    ops.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N);
          EXPECT_EQ(DescAttribute<int32_t>(d, CUBLASLT_MATMUL_DESC_TRANSB),
                    ops.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N);
          const uint32_t epilogue = c.epilogue == MatmulEpilogue::kBias ? CUBLASLT_EPILOGUE_BIAS
                                    : c.epilogue == MatmulEpilogue::kBiasGradient
                                        ? CUBLASLT_EPILOGUE_BGRADB
                                        : CUBLASLT_EPILOGUE_DEFAULT;
          EXPECT_EQ(DescAttribute<uint32_t>(d, CUBLASLT_MATMUL_DESC_EPILOGUE), epilogue);
          ExpectLayout(d.a(), math.in_type, ops.a, "A");
          ExpectLayout(d.b(), math.in_type, ops.b, "B");
          ExpectLayout(d.d(), math.out_type, ops.d, "D");
          ++products;
        }
      }
    }
  }
  // LeNet 2, ResNet-20 1, ResNet-50 1, VGG-16 3 inner products; 3 products each; 6 dtypes.
  EXPECT_EQ(products, 7 * 3 * 6);
}

TEST(CublasLtOnHost, ABadPointerIsRefusedBeforeAnyGpuCall) {
  alignas(16) static char memory[64];
  const MatmulCase c = Forward(2, 4, 4);
  const std::string error =
      ErrorOf([&] { RunMatmul(0, c, {.a = memory, .b = memory, .c = memory}); });
  EXPECT_NE(error.find("matmul C (2 x 4) = A (2 x 4) B^T (4 x 4), f32 -> f32, bias: bias at "),
            std::string::npos)
      << error;
  EXPECT_NE(ErrorOf([&] {
              RunMatmul(0, InputGrad(2, 4, 4), {.a = memory + 8, .b = memory, .c = memory});
            }).find(": A at "),
            std::string::npos);
}

}  // namespace
}  // namespace cortado::cuda
