// Compares every layer against PyTorch's values in tests/testdata/layers_golden.bin (written by
// tests/make_golden.py): forward outputs, input and parameter gradients for a fixed upstream
// gradient, and buffers after the step (batch-norm running statistics). Each case runs in f64
// (tight tolerance: same math, different summation order) and in f32 (per-op tolerance).
#include "tests/layers/golden.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "engine/base/thread_pool.h"
#include "tests/layers/layer_harness.h"

namespace cortado::testing {
namespace {

const std::string kGoldenPath = std::string(CORTADO_TESTDATA_DIR) + "/layers_golden.bin";

const GoldenFile& Golden() {
  static const GoldenFile file = ReadGoldenFile(kGoldenPath);
  return file;
}

std::vector<std::string> CaseNames() {
  try {
    std::vector<std::string> names;
    for (const GoldenCase& c : Golden().cases) names.push_back(c.name);
    return names;
  } catch (const std::exception& e) {
    return {"unreadable_golden_file"};
  }
}

struct Tolerance {
  double rtol, atol;
};

// Per-op f32 tolerances: |got - want| <= atol + rtol * |want|. f64 uses one tight bound.
Tolerance ToleranceFor(const std::string& type, DType dtype) {
  if (dtype == DType::kF64) return {1e-9, 1e-11};
  static const std::map<std::string, Tolerance> kF32 = {
      {"Convolution", {1e-4, 2e-5}},
      {"InnerProduct", {1e-4, 1e-5}},
      {"BatchNorm", {2e-4, 5e-5}},
      {"SoftmaxWithLoss", {1e-5, 1e-6}},
      {"Pooling", {1e-5, 1e-6}},
      {"Eltwise", {1e-5, 1e-6}},
      // Sums over channels or priors in f64, rounded once to f32 (the loss also rounds its f32
      // inputs' products); detections are f32-rounded decodes of f32 priors.
      {"L2Norm", {1e-5, 1e-6}},
      {"MultiBoxLoss", {1e-5, 1e-6}},
      {"DetectionOutput", {1e-5, 1e-6}},
  };
  auto it = kF32.find(type);
  return it != kF32.end() ? it->second : Tolerance{1e-6, 1e-7};
}

// Compares every element; on failure names the tensor and the largest difference.
void ExpectClose(const std::string& what, const Tensor& got, const Tensor& want, Tolerance tol) {
  ASSERT_EQ(got.numel(), want.numel())
      << what << ": got " << got.ToString() << ", want " << want.ToString();
  double worst = 0, worst_got = 0, worst_want = 0, max_diff = 0;
  int64_t worst_i = -1, bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = ElementAsDouble(got, i), w = ElementAsDouble(want, i);
    const double diff = std::fabs(g - w);
    const double ratio = diff / (tol.atol + tol.rtol * std::fabs(w));
    if (!(ratio <= 1.0)) ++bad;
    if (!(ratio <= worst)) {
      worst = std::isnan(ratio) ? INFINITY : ratio;
      worst_i = i, worst_got = g, worst_want = w;
    }
    if (!(diff <= max_diff)) max_diff = diff;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.numel()
                    << " elements out of tolerance (rtol " << tol.rtol << ", atol " << tol.atol
                    << "); largest |diff| " << max_diff << ", worst at element " << worst_i
                    << ": got " << worst_got << ", want " << worst_want;
}

std::string Suffix(const std::string& full, const std::string& layer_name) {
  return full.substr(layer_name.size() + 1);  // "golden.weight" -> "weight"
}

void RunCase(const GoldenCase& gc, DType dtype) {
  SCOPED_TRACE(StrCat("case '", gc.name, "' (", gc.type, ") in ", DTypeName(dtype)));
  const Tolerance tol = ToleranceFor(gc.type, dtype);
  std::vector<Tensor> inputs;
  for (int i = 0; gc.Has(StrCat("bottom.", i)); ++i) {
    const Tensor& src = gc.Get(StrCat("bottom.", i));
    if (src.dtype() == DType::kI32) {
      inputs.push_back(src.Clone());
    } else {
      Tensor t(src.shape(), dtype);
      t.ConvertFrom(src);
      inputs.push_back(t);
    }
  }
  int num_tops = 0;
  while (gc.Has(StrCat("top.", num_tops))) ++num_tops;
  ASSERT_GT(num_tops, 0);
  LayerHarness h(gc.type, gc.settings, inputs, num_tops, gc.phase, "golden");
  Layer& layer = h.layer();

  // Load parameter and buffer values; the layer and the file must agree on which exist.
  std::set<std::string> file_params, layer_params;
  for (const auto& [key, t] : gc.tensors) {
    if (key.rfind("param.", 0) == 0) file_params.insert(key.substr(6));
  }
  for (Param& p : layer.params()) {
    const std::string suffix = Suffix(p.name, layer.name());
    layer_params.insert(suffix);
    if (gc.Has("param." + suffix)) p.value.ConvertFrom(gc.Get("param." + suffix));
  }
  EXPECT_EQ(file_params, layer_params) << "parameters differ between the layer and the file";
  for (Buffer& b : layer.buffers()) {
    const std::string suffix = Suffix(b.name, layer.name());
    if (gc.Has("buffer." + suffix)) b.value.ConvertFrom(gc.Get("buffer." + suffix));
  }

  h.Forward();
  for (int j = 0; j < num_tops; ++j) {
    ExpectClose(StrCat("top ", j), h.top()[j]->data, gc.Get(StrCat("top.", j)), tol);
  }
  for (Buffer& b : layer.buffers()) {
    const std::string key = "buffer_after." + Suffix(b.name, layer.name());
    if (gc.Has(key)) ExpectClose(b.name, b.value, gc.Get(key), tol);
  }
  if (!gc.Has("top_grad.0")) return;
  std::vector<Tensor> top_grads;
  for (int j = 0; j < num_tops; ++j) {
    const Tensor& src = gc.Get(StrCat("top_grad.", j));
    Tensor t(h.top()[j]->data.shape(), dtype);
    t.ConvertFrom(src);
    top_grads.push_back(t);
  }
  h.Backward(top_grads);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string key = StrCat("bottom_grad.", i);
    if (gc.Has(key))
      ExpectClose(StrCat("input ", i, " grad"), h.bottom()[i]->grad, gc.Get(key), tol);
  }
  for (Param& p : layer.params()) {
    const std::string key = "param_grad." + Suffix(p.name, layer.name());
    if (gc.Has(key)) {
      ExpectClose(p.name + " grad", p.grad, gc.Get(key), tol);
    } else {
      ADD_FAILURE() << "the file has no gradient for " << p.name;
    }
  }
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesPyTorch) {
  const GoldenFile& file = Golden();  // throws with the path when unreadable
  for (const GoldenCase& gc : file.cases) {
    if (gc.name != GetParam()) continue;
    RunCase(gc, DType::kF64);
    RunCase(gc, DType::kF32);
    return;
  }
  FAIL() << "no case " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Layers, GoldenTest, ::testing::ValuesIn(CaseNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(GoldenFileTest, RecordsTorchVersionAndCoversEveryLayerType) {
  const GoldenFile& file = Golden();
  EXPECT_FALSE(file.torch_version.empty());
  std::set<std::string> covered;
  for (const GoldenCase& c : file.cases) covered.insert(c.type);
  for (const char* type :
       {"Convolution", "InnerProduct", "BatchNorm", "ReLU", "Pooling", "Eltwise", "Dropout",
        "Flatten", "Concat", "SoftmaxWithLoss", "Accuracy", "Split", "L2Norm", "Permute", "Reshape",
        "PriorBox", "MultiBoxLoss", "DetectionOutput"}) {
    EXPECT_TRUE(covered.count(type)) << "no golden case for " << type;
  }
}

// The blocked convolution path splits images across threads differently at other thread
// counts; the results must still match PyTorch.
TEST(GoldenFileTest, ConvolutionMatchesAtThreeThreads) {
  const int saved = NumThreads();
  SetNumThreads(3);
  for (const GoldenCase& c : Golden().cases) {
    if (c.type == "Convolution") RunCase(c, DType::kF64);
  }
  SetNumThreads(saved);
}

}  // namespace
}  // namespace cortado::testing
