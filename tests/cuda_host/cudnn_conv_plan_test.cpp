// The cuDNN convolution's descriptors, operation graphs and execution plans, checked against
// cuDNN itself on a machine without a GPU. cuDNN 9.19 finalizes tensor, convolution and operation
// descriptors and operation graphs without a device, and, given a GPU's properties as JSON
// (deviceless mode, cuDNN 9.8+), runs its heuristics and finalizes execution plans for that GPU;
// only running a plan (and reading a real GPU's properties) needs the device. The GPU is a
// modeled H100 SXM (tests/testdata/cudnn/h100_sxm_modeled.json: NVIDIA's published figures, not
// read from a device; the device check records the real one).
//
// For every convolution of LeNet, ResNet-20, ResNet-50 and VGG-16 (read from the model builders,
// at the batch each trains at), in each pass, format and dtype: cuDNN accepts the graph (its
// finalize checks the geometry), its legacy geometry call agrees with our output size, and a plan
// exists whose engine the case allows. One plan's JSON (cuDNN's own serialization) shows the graph
// as cuDNN understood it.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/cuda/cuda_libraries.h"
#include "engine/cuda/cudnn_conv.h"
#include "tests/support/conv_geometries.h"
#include "tests/support/errors.h"
#include "tests/support/files.h"
#include "tests/support/net_shapes.h"

namespace cortado::cuda {
namespace {

using cortado::testing::ErrorOf;
using cortado::testing::NetConvolution;

std::string ModeledH100Json() {
  return cortado::testing::ReadFileBytes(std::string(CORTADO_TESTDATA_DIR) +
                                         "/cudnn/h100_sxm_modeled.json");
}

const std::vector<NetConvolution>& NetConvolutions() {
  static const std::vector<NetConvolution> convs = cortado::testing::DistinctNetConvolutions();
  return convs;
}

// The ways a layer runs a convolution: the net's dtype and format (f32 on NCHW is the plain
// path; NHWC for every dtype as `model.layout: auto` picks on a GPU), and NHWC activations with
// the net's own OIHW weights (no reordered copy).
std::vector<ConvCase> CasesOf(const ConvGeometry& geometry) {
  std::vector<ConvCase> cases;
  struct Math {
    DType dtype;
    bool tf32;
    ConvFormat format, filter_format;
  };
  const Math maths[] = {{DType::kF32, false, ConvFormat::kNCHW, ConvFormat::kNCHW},
                        {DType::kF32, false, ConvFormat::kNHWC, ConvFormat::kNHWC},
                        {DType::kF32, true, ConvFormat::kNHWC, ConvFormat::kNHWC},
                        {DType::kF16, false, ConvFormat::kNHWC, ConvFormat::kNHWC},
                        {DType::kBF16, false, ConvFormat::kNHWC, ConvFormat::kNHWC},
                        {DType::kF16, false, ConvFormat::kNHWC, ConvFormat::kNCHW}};
  for (ConvPass pass : {ConvPass::kForward, ConvPass::kBackwardData, ConvPass::kBackwardFilter}) {
    for (const Math& m : maths) {
      ConvCase c;
      c.geometry = geometry;
      c.format = m.format, c.filter_format = m.filter_format;
      c.dtype = m.dtype, c.allow_tf32 = m.tf32, c.pass = pass;
      cases.push_back(c);
    }
  }
  return cases;
}

// cuDNN's legacy geometry call (deprecated in 9, still the library's own arithmetic), reached by
// name in the library that Libraries() loaded.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
template <typename Fn>
Fn* Legacy(const char* name) {
  Libraries();
  auto* fn = reinterpret_cast<Fn*>(dlsym(RTLD_DEFAULT, name));
  CORTADO_CHECK(fn != nullptr, "no ", name, " in libcudnn");
  return fn;
}

std::array<int, 4> LegacyOutputDims(const ConvCase& c) {
  const ConvGeometry& g = c.geometry;
  const std::array<ConvTensorLayout, 3> t = ConvTensorLayouts(c);
  cudnnTensorDescriptor_t x = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  auto check = [](cudnnStatus_t status, const char* what) {
    CORTADO_CHECK(status == CUDNN_STATUS_SUCCESS, what, " failed: ", status);
  };
  check(Legacy<decltype(cudnnCreateTensorDescriptor)>("cudnnCreateTensorDescriptor")(&x),
        "cudnnCreateTensorDescriptor");
  check(Legacy<decltype(cudnnSetTensor4dDescriptorEx)>("cudnnSetTensor4dDescriptorEx")(
            x, CUDNN_DATA_FLOAT, static_cast<int>(g.n), static_cast<int>(g.c),
            static_cast<int>(g.h), static_cast<int>(g.w), static_cast<int>(t[0].strides[0]),
            static_cast<int>(t[0].strides[1]), static_cast<int>(t[0].strides[2]),
            static_cast<int>(t[0].strides[3])),
        "cudnnSetTensor4dDescriptorEx");
  check(Legacy<decltype(cudnnCreateFilterDescriptor)>("cudnnCreateFilterDescriptor")(&w),
        "cudnnCreateFilterDescriptor");
  check(Legacy<decltype(cudnnSetFilter4dDescriptor)>("cudnnSetFilter4dDescriptor")(
            w, CUDNN_DATA_FLOAT,
            c.filter_format == ConvFormat::kNHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
            static_cast<int>(g.k), static_cast<int>(g.c / g.groups), static_cast<int>(g.kh),
            static_cast<int>(g.kw)),
        "cudnnSetFilter4dDescriptor");
  check(
      Legacy<decltype(cudnnCreateConvolutionDescriptor)>("cudnnCreateConvolutionDescriptor")(&conv),
      "cudnnCreateConvolutionDescriptor");
  check(
      Legacy<decltype(cudnnSetConvolution2dDescriptor)>("cudnnSetConvolution2dDescriptor")(
          conv, static_cast<int>(g.pad_h), static_cast<int>(g.pad_w), static_cast<int>(g.stride_h),
          static_cast<int>(g.stride_w), static_cast<int>(g.dilation_h),
          static_cast<int>(g.dilation_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
      "cudnnSetConvolution2dDescriptor");
  check(Legacy<decltype(cudnnSetConvolutionGroupCount)>("cudnnSetConvolutionGroupCount")(
            conv, static_cast<int>(g.groups)),
        "cudnnSetConvolutionGroupCount");
  std::array<int, 4> dims{};
  check(Legacy<decltype(cudnnGetConvolution2dForwardOutputDim)>(
            "cudnnGetConvolution2dForwardOutputDim")(conv, x, w, &dims[0], &dims[1], &dims[2],
                                                     &dims[3]),
        "cudnnGetConvolution2dForwardOutputDim");
  Legacy<decltype(cudnnDestroyConvolutionDescriptor)>("cudnnDestroyConvolutionDescriptor")(conv);
  Legacy<decltype(cudnnDestroyFilterDescriptor)>("cudnnDestroyFilterDescriptor")(w);
  Legacy<decltype(cudnnDestroyTensorDescriptor)>("cudnnDestroyTensorDescriptor")(x);
  return dims;
}
#pragma GCC diagnostic pop

TEST(CudnnOnHost, LoadsTheGraphApiWithoutAGpu) {
  const CudaLibraries& l = Libraries();
  EXPECT_GE(l.cudnnGetVersion(), 90800u) << "deviceless plans need cuDNN 9.8 or later";
}

TEST(CudnnOnHost, EveryNetConvolutionGraphFinalizesAndCudnnAgreesOnItsOutput) {
  ASSERT_FALSE(NetConvolutions().empty());
  for (const NetConvolution& conv : NetConvolutions()) {
    const ConvGeometry& g = conv.geometry;
    for (const ConvCase& c : CasesOf(g)) {
      EXPECT_EQ(ErrorOf([&] { BuildConvGraph(c); }), "") << conv.net << " " << conv.layer;
    }
    ConvCase nhwc;
    nhwc.geometry = g;
    const std::array<int, 4> dims = LegacyOutputDims(nhwc);
    EXPECT_EQ(dims, (std::array<int, 4>{static_cast<int>(g.n), static_cast<int>(g.k),
                                        static_cast<int>(g.out_h()), static_cast<int>(g.out_w())}))
        << conv.net << " " << conv.layer << ": " << g.ToString();
  }
}

TEST(CudnnOnHost, GroupsAndDilationAreWhatCudnnComputes) {
  for (const ConvGeometry& g : cortado::testing::UnusualConvolutions()) {
    ConvCase c;
    c.geometry = g;
    const std::array<int, 4> dims = LegacyOutputDims(c);
    EXPECT_EQ(dims[2], g.out_h()) << g.ToString();
    EXPECT_EQ(dims[3], g.out_w()) << g.ToString();
    for (const ConvCase& each : CasesOf(g)) {
      EXPECT_EQ(ErrorOf([&] { BuildConvGraph(each); }), "") << ConvKey(each);
    }
  }
}

TEST(CudnnOnHost, AGraphCudnnRefusesNamesTheCase) {
  ConvCase c;
  c.geometry = {.n = 2, .c = 8, .h = 8, .w = 8, .k = 8, .kh = 3, .kw = 3};
  c.dtype = DType::kF64;
  EXPECT_NE(ErrorOf([&] {
              BuildConvGraph(c);
            }).find("cuDNN convolutions take f32, f16 or bf16 tensors, not f64"),
            std::string::npos);
  c.dtype = DType::kF32, c.geometry.groups = 3;
  EXPECT_NE(ErrorOf([&] { BuildConvGraph(c); }).find("groups must divide"), std::string::npos);
}

TEST(CudnnOnHost, DevicePropertiesRoundTripThroughJson) {
  const CudnnDescriptor h100 = DevicePropertiesFromJson(ModeledH100Json());
  const nlohmann::json written = nlohmann::json::parse(DevicePropertiesJson(h100));
  EXPECT_EQ(written, nlohmann::json::parse(ModeledH100Json()));
  EXPECT_NE(ErrorOf([] {
              DevicePropertiesFromJson("{\"multiProcessorCount\": 132}");
            }).find("cuDNN: these device properties do not parse"),
            std::string::npos);
}

TEST(CudnnOnHost, ThePlanIsTheGraphWeBuilt) {
  ConvPlanCache cache(DevicePropertiesFromJson(ModeledH100Json()));
  ConvCase c;
  c.geometry = cortado::testing::StridedResNetConv();
  c.dtype = DType::kBF16;
  struct Expected {
    ConvPass pass;
    const char* operation;
    const char *x, *w, *y;  // the node's names for the tensors in x's, w's and y's places
  };
  const Expected passes[] = {
      {ConvPass::kForward, "CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR", "X", "W", "Y"},
      {ConvPass::kBackwardData, "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR",
       "dX", "W", "dY"},
      {ConvPass::kBackwardFilter, "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR",
       "X", "dW", "dY"}};
  for (const Expected& e : passes) {
    c.pass = e.pass;
    const ConvPlan& plan = cache.Get(c);
    const nlohmann::json json = nlohmann::json::parse(
        plan.plan.plan.GetString(CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION));
    const nlohmann::json& graph = json.at("operationGraph");
    const std::array<ConvTensorLayout, 3> layouts = ConvTensorLayouts(c);
    ASSERT_EQ(graph.at("tensors").size(), 3u) << graph.dump();
    for (size_t i = 0; i < 3; ++i) {
      nlohmann::json t;  // cuDNN lists the tensors in its own order: find ours by its uid
      for (const nlohmann::json& each : graph.at("tensors")) {
        if (each.at("name") == std::to_string(kConvUids[i])) t = each;
      }
      ASSERT_FALSE(t.is_null()) << "no tensor " << kConvUids[i] << " in " << graph.dump();
      SCOPED_TRACE(t.dump());
      EXPECT_EQ(t.at("dataType"), "CUDNN_DATA_BFLOAT16");
      EXPECT_EQ(t.at("dim").get<std::vector<int64_t>>(),
                std::vector<int64_t>(layouts[i].dims.begin(), layouts[i].dims.end()));
      EXPECT_EQ(t.at("stride").get<std::vector<int64_t>>(),
                std::vector<int64_t>(layouts[i].strides.begin(), layouts[i].strides.end()));
      EXPECT_EQ(t.at("ptrAlignment"), 16);
    }
    ASSERT_EQ(graph.at("nodes").size(), 1u);
    const nlohmann::json& node = graph.at("nodes")[0];
    SCOPED_TRACE(node.dump());
    EXPECT_EQ(node.at("operation"), e.operation);
    EXPECT_EQ(node.at("mode"), "CUDNN_CROSS_CORRELATION");
    EXPECT_EQ(node.at("mathPrec"), "CUDNN_DATA_FLOAT");  // f32 accumulation
    EXPECT_EQ(node.at("alpha"), 1.0);
    EXPECT_EQ(node.at("beta"), 0.0);
    EXPECT_EQ(node.at("pad"), nlohmann::json({1, 1}));
    EXPECT_EQ(node.at("stride"), nlohmann::json({2, 2}));
    EXPECT_EQ(node.at("dilation"), nlohmann::json({1, 1}));
    EXPECT_EQ(node.at(e.x), std::to_string(kConvUids[0]));
    EXPECT_EQ(node.at(e.w), std::to_string(kConvUids[1]));
    EXPECT_EQ(node.at(e.y), std::to_string(kConvUids[2]));
    EXPECT_EQ(json.at("engine").at("engineId"), plan.plan.engine);
    EXPECT_EQ(json.at("GPUProfile").at("multiProcessorCount"), 132);
  }
}

TEST(CudnnOnHost, EveryNetConvolutionHasAPlanOnAModeledH100) {
  ConvPlanCache cache(DevicePropertiesFromJson(ModeledH100Json()));
  int64_t largest_workspace = 0, cases = 0, tensor_core_16bit = 0, nhwc_16bit = 0;
  for (const NetConvolution& conv : NetConvolutions()) {
    for (const ConvCase& c : CasesOf(conv.geometry)) {
      std::string error;
      const ConvPlan* plan = nullptr;
      try {
        plan = &cache.Get(c);
      } catch (const Error& e) {
        error = e.what();
      }
      ASSERT_EQ(error, "") << conv.net << " " << conv.layer;
      ++cases;
      EXPECT_EQ(ConvEngineFilter(c, plan->plan.notes), "") << plan->key;
      EXPECT_LE(plan->plan.workspace_bytes, kConvWorkspaceLimit) << plan->key;
      largest_workspace = std::max(largest_workspace, plan->plan.workspace_bytes);
      const bool tensor_core = std::count(plan->plan.notes.begin(), plan->plan.notes.end(),
                                          CUDNN_NUMERICAL_NOTE_TENSOR_CORE) > 0;
      if (c.dtype != DType::kF32 && c.format == ConvFormat::kNHWC) {
        ++nhwc_16bit;
        tensor_core_16bit += tensor_core;
      }
      if (c.dtype == DType::kF32 && !c.allow_tf32) {
        EXPECT_FALSE(tensor_core) << plan->key;
      }
    }
  }
  EXPECT_EQ(cache.size(), static_cast<size_t>(cases));
  // Half-precision NHWC convolutions are what tensor cores are for: all but those whose channels
  // are too few for their tiles (LeNet's and ResNet's first layers) get one.
  EXPECT_GE(tensor_core_16bit, nhwc_16bit * 9 / 10) << tensor_core_16bit << " of " << nhwc_16bit;
  RecordProperty("plans", static_cast<int>(cases));
  RecordProperty("largest_workspace_bytes", std::to_string(largest_workspace));
}

TEST(CudnnOnHost, PlansAreMadeOncePerCase) {
  ConvPlanCache cache(DevicePropertiesFromJson(ModeledH100Json()));
  ConvCase c;
  c.geometry = {
      .n = 32, .c = 64, .h = 28, .w = 28, .k = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
  c.dtype = DType::kF16;
  const ConvPlan& first = cache.Get(c);
  EXPECT_EQ(&cache.Get(c), &first);
  EXPECT_EQ(first.key, ConvKey(c));
  EXPECT_EQ(cache.size(), 1u);
  ConvCase other = c;
  other.pass = ConvPass::kBackwardData;
  EXPECT_NE(&cache.Get(other), &first);
  ConvCase same_for_f16 = c;
  same_for_f16.allow_tf32 = true;  // no TF32 for f16: the same case
  EXPECT_EQ(&cache.Get(same_for_f16), &first);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(CudnnOnHost, NoEngineNamesTheLayersGeometry) {
  // No engine needs less than no workspace at all... so a negative limit passes over every one.
  ConvPlanCache cache(DevicePropertiesFromJson(ModeledH100Json()), /*workspace_limit=*/-1);
  ConvCase c;
  c.geometry = {.n = 16, .c = 64, .h = 14, .w = 14, .k = 32, .kh = 1, .kw = 1};
  const std::string error = ErrorOf([&] { cache.Get(c); });
  EXPECT_NE(error.find("cuDNN has no engine for convolution forward, NHWC (filter OHWI), f32 "
                       "(no TF32), N=16 C=64 H=14 W=14 -> K=32, kernel 1x1, stride 1x1, pad "
                       "0x0, dilation 1x1, groups 1, deterministic: no engine configuration fits"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("B of workspace, over the limit of -1"), std::string::npos) << error;
  EXPECT_EQ(cache.size(), 0u);
}

TEST(CudnnOnHost, TheVariantPackIsBuiltAndOnlyExecutionWantsTheGpu) {
  // The variant pack (uids, pointers, workspace) finalizes without a GPU; executing needs a
  // handle, which needs one: here cuDNN refuses the null handle, naming no variant-pack problem.
  ConvPlanCache cache(DevicePropertiesFromJson(ModeledH100Json()));
  ConvCase c;
  c.geometry = {.n = 4, .c = 16, .h = 8, .w = 8, .k = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
  const ConvPlan& plan = cache.Get(c);
  alignas(16) static char memory[3][16];
  void* const pointers[3] = {memory[0], memory[1], memory[2]};
  const std::string error =
      ErrorOf([&] { ExecutePlan(nullptr, plan.plan, kConvUids, pointers, nullptr); });
  EXPECT_NE(error.find("cuDNN: executing the plan of engine " + std::to_string(plan.plan.engine)),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("failed: CUDNN_STATUS_BAD_PARAM"), std::string::npos) << error;
}

TEST(CudnnOnHost, ABadPointerIsRefusedBeforeAnyGpuCall) {
  ConvCase c;
  c.geometry = {.n = 2, .c = 8, .h = 8, .w = 8, .k = 8, .kh = 3, .kw = 3};
  alignas(16) static char memory[64];
  const std::string misaligned =
      ErrorOf([&] { RunConvolution(0, c, {.x = memory, .w = memory + 4, .y = memory}); });
  EXPECT_NE(misaligned.find("convolution forward, NHWC (filter OHWI), f32 (no TF32), N=2 C=8"),
            std::string::npos)
      << misaligned;
  EXPECT_NE(misaligned.find(": tensor w at "), std::string::npos) << misaligned;
  EXPECT_NE(misaligned.find(" is not a device pointer aligned to 16 bytes"), std::string::npos);
  EXPECT_NE(
      ErrorOf([&] { RunConvolution(0, c, {.x = memory, .w = memory}); }).find(": tensor y at "),
      std::string::npos);
}

}  // namespace
}  // namespace cortado::cuda
