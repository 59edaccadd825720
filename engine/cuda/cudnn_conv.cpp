#include "engine/cuda/cudnn_conv.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "engine/base/error.h"
#include "engine/cuda/cuda_context.h"

namespace cortado::cuda {
namespace {

// Every pointer given for a tensor is promised to cuDNN aligned this far (its vectorized kernels
// depend on it); RunConvolution checks the promise.
constexpr int64_t kAlignment = 16;

cudnnDataType_t CudnnType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDNN_DATA_FLOAT;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      Fail("cuDNN convolutions take f32, f16 or bf16 tensors, not ", DTypeName(dtype));
  }
}

std::string MathName(const ConvCase& c) {
  if (c.dtype != DType::kF32) return DTypeName(c.dtype);
  return c.allow_tf32 ? "f32 (TF32 allowed)" : "f32 (no TF32)";
}

bool Has(const std::vector<cudnnBackendNumericalNote_t>& notes, cudnnBackendNumericalNote_t note) {
  return std::find(notes.begin(), notes.end(), note) != notes.end();
}

// The operation of the case's pass on its three tensors.
CudnnDescriptor ConvOperation(const ConvCase& c, const CudnnDescriptor& x, const CudnnDescriptor& w,
                              const CudnnDescriptor& y, const CudnnDescriptor& conv) {
  struct Names {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  static constexpr Names kForward = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  static constexpr Names kBackwardData = {
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
  static constexpr Names kBackwardFilter = {
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  const Names& names = c.pass == ConvPass::kForward        ? kForward
                       : c.pass == ConvPass::kBackwardData ? kBackwardData
                                                           : kBackwardFilter;
  CudnnDescriptor op(names.type);
  op.SetDescriptor(names.x, x).SetDescriptor(names.w, w).SetDescriptor(names.y, y);
  op.SetDescriptor(names.conv, conv);
  const float alpha = 1.0f, beta = 0.0f;  // overwrite the output
  op.Set(names.alpha, CUDNN_TYPE_FLOAT, 1, &alpha).Set(names.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  op.Finalize();
  return op;
}

}  // namespace

const char* ConvPassName(ConvPass pass) {
  switch (pass) {
    case ConvPass::kForward:
      return "forward";
    case ConvPass::kBackwardData:
      return "backward data";
    case ConvPass::kBackwardFilter:
      return "backward filter";
  }
  return "?";
}

int64_t ConvOutputSize(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = dilation * (kernel - 1) + 1;  // the kernel's extent on the input
  if (in + 2 * pad < span) return 0;
  return (in + 2 * pad - span) / stride + 1;
}

std::string ConvGeometry::ToString() const {
  return StrCat("N=", n, " C=", c, " H=", h, " W=", w, " -> K=", k, ", kernel ", kh, "x", kw,
                ", stride ", stride_h, "x", stride_w, ", pad ", pad_h, "x", pad_w, ", dilation ",
                dilation_h, "x", dilation_w, ", groups ", groups);
}

void ConvGeometry::Check() const {
  const bool positive = n > 0 && c > 0 && h > 0 && w > 0 && k > 0 && kh > 0 && kw > 0 &&
                        stride_h > 0 && stride_w > 0 && pad_h >= 0 && pad_w >= 0 &&
                        dilation_h > 0 && dilation_w > 0 && groups > 0;
  if (!positive) Fail("convolution ", ToString(), ": sizes must be positive (pads not negative)");
  if (c % groups != 0 || k % groups != 0) {
    Fail("convolution ", ToString(), ": groups must divide the input and output channels");
  }
  if (out_h() <= 0 || out_w() <= 0) {
    Fail("convolution ", ToString(), ": the kernel does not fit the padded input");
  }
}

std::string ConvKey(const ConvCase& c) {
  const char* format = c.format == ConvFormat::kNHWC ? "NHWC" : "NCHW";
  const char* filter = c.filter_format == ConvFormat::kNHWC ? "OHWI" : "OIHW";
  return StrCat(ConvPassName(c.pass), ", ", format, " (filter ", filter, "), ", MathName(c), ", ",
                c.geometry.ToString(), c.deterministic ? ", deterministic" : "");
}

std::array<int64_t, 4> DenseStrides(const std::array<int64_t, 4>& dims, ConvFormat format) {
  const auto [d0, d1, d2, d3] = dims;
  if (format == ConvFormat::kNCHW) return {d1 * d2 * d3, d2 * d3, d3, 1};
  return {d1 * d2 * d3, 1, d3 * d1, d1};
}

std::array<ConvTensorLayout, 3> ConvTensorLayouts(const ConvCase& c) {
  const ConvGeometry& g = c.geometry;
  const std::array<int64_t, 4> x = {g.n, g.c, g.h, g.w};
  const std::array<int64_t, 4> w = {g.k, g.c / g.groups, g.kh, g.kw};
  const std::array<int64_t, 4> y = {g.n, g.k, g.out_h(), g.out_w()};
  return {ConvTensorLayout{x, DenseStrides(x, c.format)},
          ConvTensorLayout{w, DenseStrides(w, c.filter_format)},
          ConvTensorLayout{y, DenseStrides(y, c.format)}};
}

std::string ConvEngineFilter(const ConvCase& c,
                             const std::vector<cudnnBackendNumericalNote_t>& notes) {
  if (Has(notes, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return "down-converts its inputs";
  if (Has(notes, CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)) {
    return "accumulates in reduced precision (f32 accumulation is asked)";
  }
  if (c.dtype == DType::kF32 && !c.allow_tf32 && Has(notes, CUDNN_NUMERICAL_NOTE_TENSOR_CORE)) {
    return "tensor cores (TF32) where TF32 is not allowed";
  }
  if (c.deterministic && Has(notes, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) {
    return "nondeterministic where determinism is asked";
  }
  return "";
}

CudnnDescriptor BuildConvGraph(const ConvCase& c) {
  c.geometry.Check();
  const cudnnDataType_t dtype = CudnnType(c.dtype);
  const std::array<ConvTensorLayout, 3> layouts = ConvTensorLayouts(c);
  std::vector<CudnnDescriptor> tensors;
  for (size_t i = 0; i < layouts.size(); ++i) {
    tensors.push_back(
        MakeTensor(kConvUids[i], layouts[i].dims, layouts[i].strides, dtype, kAlignment));
  }
  const ConvGeometry& g = c.geometry;
  CudnnDescriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;             // f32 accumulation for every dtype
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;  // what nn.Conv2d computes
  const int64_t pad[2] = {g.pad_h, g.pad_w};
  const int64_t stride[2] = {g.stride_h, g.stride_w};
  const int64_t dilation[2] = {g.dilation_h, g.dilation_w};
  conv.SetInt64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2);
  conv.Set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  conv.Set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  conv.SetInt64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, pad);
  conv.SetInt64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, pad);
  conv.SetInt64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, stride);
  conv.SetInt64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, dilation);
  conv.Finalize();
  // Groups are implied: cuDNN reads them from C over the filter's second dimension.
  CudnnDescriptor op = ConvOperation(c, tensors[0], tensors[1], tensors[2], conv);
  CudnnDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.SetDescriptor(CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
  graph.Finalize();
  return graph;
}

ConvPlanCache::ConvPlanCache(CudnnDescriptor device_properties, int64_t workspace_limit)
    : device_properties_(std::move(device_properties)), workspace_limit_(workspace_limit) {}

const ConvPlan& ConvPlanCache::Get(const ConvCase& c) {
  std::string key = ConvKey(c);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<ConvPlan>();
  try {
    const CudnnDescriptor graph = BuildConvGraph(c);
    plan->plan = BuildPlan(
        graph, device_properties_,
        [&c](const std::vector<cudnnBackendNumericalNote_t>& notes) {
          return ConvEngineFilter(c, notes);
        },
        workspace_limit_);
  } catch (const Error& e) {
    Fail("cuDNN has no engine for convolution ", key, ": ", e.what());
  }
  plan->key = std::move(key);
  const ConvPlan& stored = *plan;
  plans_.emplace(stored.key, std::move(plan));
  return stored;
}

size_t ConvPlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

void RunConvolution(int device, const ConvCase& c, const ConvTensors& tensors) {
  void* const pointers[3] = {tensors.x, tensors.w, tensors.y};
  static const char* const kNames[3] = {"x", "w", "y"};
  for (int i = 0; i < 3; ++i) {
    if (pointers[i] == nullptr || reinterpret_cast<uintptr_t>(pointers[i]) % kAlignment != 0) {
      Fail("convolution ", ConvKey(c), ": tensor ", kNames[i], " at ", pointers[i],
           " is not a device pointer aligned to ", kAlignment, " bytes");
    }
  }
  // One cache per GPU, made for that GPU's properties on its first convolution; never freed
  // (as the contexts: cuda_context.h).
  static std::mutex mu;
  static std::map<int, ConvPlanCache*> caches;
  CudaContext& context = CudaContext::Get(device);
  ConvPlanCache* cache = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    ConvPlanCache*& slot = caches[device];
    if (slot == nullptr) slot = new ConvPlanCache(DevicePropertiesOf(context.cudnn()));
    cache = slot;
  }
  const ConvPlan& plan = cache->Get(c);
  context.MakeCurrent();
  void* workspace = plan.plan.workspace_bytes > 0
                        ? context.Workspace(static_cast<size_t>(plan.plan.workspace_bytes))
                        : nullptr;
  ExecutePlan(context.cudnn(), plan.plan, kConvUids, pointers, workspace);
}

}  // namespace cortado::cuda
