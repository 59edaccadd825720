// Convolutions on a GPU through cuDNN's graph API (cudnn_graph.h): forward, backward-data and
// backward-filter of a 2-d cross-correlation (nn.Conv2d: stride, zero padding, dilation,
// groups), on activations in NHWC (channels-last, the fast layout on both devices) or NCHW, in
// f32 (TF32 allowed or not), f16 or bf16 with f32 accumulation.
//
// A ConvCase (geometry, formats, dtype, math, pass) gets its plan once: ConvPlanCache builds the
// operation graph, asks cuDNN's heuristics, takes the first engine configuration whose numerical
// notes the case allows (ConvEngineFilter) and keeps the plan, with its engine and workspace
// size, for every later call of the same case. No engine for a case: an error naming the case.
//
// The layers' GPU path calls RunConvolution with device pointers (16-byte aligned; every buffer of
// the caching allocator and of the memory plan is) to tensors whose logical shape is the
// engine's own, (N, C, H, W), whatever the format:
//   x  (N, C, H, W)             in `format`
//   w  (K, C / groups, kh, kw)  in `filter_format`: OIHW (NCHW) is the net's own weights; with
//                               NHWC activations cuDNN's fast kernels want OHWI (NHWC), a private
//                               reordered copy that the layer keeps (the layout decision's
//                               point 4: weights stay OIHW in the net and in checkpoints)
//   y  (N, K, P, Q)             in `format`, P = out_h(), Q = out_w()
// kForward writes y from x and w; kBackwardData writes dx into x's place from dy (in y's place)
// and w; kBackwardFilter writes dw into w's place from x and dy. Each overwrites its output
// (cuDNN's beta is 0); a bias is the layer's own kernel.
//
// Threads: the cache is thread-safe; RunConvolution queues on the GPU's compute stream, which
// the engine drives from one thread.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/cuda/cudnn_graph.h"
#include "engine/tensor/dtype.h"

namespace cortado::cuda {

enum class ConvFormat : uint8_t { kNCHW, kNHWC };
enum class ConvPass : uint8_t { kForward, kBackwardData, kBackwardFilter };

const char* ConvPassName(ConvPass pass);  // "forward", "backward data", "backward filter"

// Output size along one axis, as nn.Conv2d: (in + 2 pad - dilation (kernel - 1) - 1) / stride + 1;
// 0 or less where the kernel does not fit.
int64_t ConvOutputSize(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation);

struct ConvGeometry {
  int64_t n = 1, c = 1, h = 1, w = 1;  // input (N, C, H, W)
  int64_t k = 1;                       // output channels
  int64_t kh = 1, kw = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;

  int64_t out_h() const { return ConvOutputSize(h, kh, stride_h, pad_h, dilation_h); }
  int64_t out_w() const { return ConvOutputSize(w, kw, stride_w, pad_w, dilation_w); }
  // "N=256 C=64 H=56 W=56 -> K=128, kernel 3x3, stride 2x2, pad 1x1, dilation 1x1, groups 1"
  std::string ToString() const;
  // Throws naming the geometry when a size is not positive, groups do not divide C and K, or the
  // kernel does not fit the padded input.
  void Check() const;
  bool operator==(const ConvGeometry&) const = default;
};

struct ConvCase {
  ConvGeometry geometry;
  ConvFormat format = ConvFormat::kNHWC;         // x and y
  ConvFormat filter_format = ConvFormat::kNHWC;  // w (kNHWC: OHWI in memory)
  DType dtype = DType::kF32;                     // of x, w and y: f32, f16 or bf16
  bool allow_tf32 = false;                       // f32 only: tensor cores at TF32's precision
  bool deterministic = true;                     // no engine whose results vary run to run
  ConvPass pass = ConvPass::kForward;
};

// The case's identity in the plan cache and in messages, e.g.
//   "forward, NHWC (filter OHWI), f16, N=8 C=64 H=56 W=56 -> K=128, kernel 3x3, stride 2x2,
//    pad 1x1, dilation 1x1, groups 1, deterministic"
// allow_tf32 is part of it for f32 only (f16 and bf16 never use TF32).
std::string ConvKey(const ConvCase& c);

// Strides in elements of a dense tensor of logical dims (d0, d1, d2, d3) = (N, C, H, W) (or
// (K, C, kh, kw) for a filter) in `format`: NCHW row-major, or NHWC with d1 fastest.
std::array<int64_t, 4> DenseStrides(const std::array<int64_t, 4>& dims, ConvFormat format);

// The dims and strides cuDNN is given for x, w and y (in that order).
struct ConvTensorLayout {
  std::array<int64_t, 4> dims;
  std::array<int64_t, 4> strides;
};
std::array<ConvTensorLayout, 3> ConvTensorLayouts(const ConvCase& c);

// The unique ids of x, w and y in the operation graph and the variant pack (dx, dw and dy take
// the ids of the tensors whose place they take).
inline constexpr std::array<int64_t, 3> kConvUids = {'x', 'w', 'y'};

// Whether `c` takes an engine configuration with these numerical notes: "" if it does, otherwise
// why not. Never: down-converted inputs or reduced-precision accumulation (f32 accumulation is
// the promise); tensor cores for f32 without allow_tf32; nondeterministic engines when
// `deterministic`.
std::string ConvEngineFilter(const ConvCase& c,
                             const std::vector<cudnnBackendNumericalNote_t>& notes);

// The finalized operation graph of `c`: x, w, y tensor descriptors, the convolution descriptor
// (cross-correlation, f32 compute) and the one operation of the pass. cuDNN checks the geometry
// when it finalizes. No GPU needed.
CudnnDescriptor BuildConvGraph(const ConvCase& c);

// Workspace above which an engine configuration is passed over (fast engines on ResNet-50 at
// batch 256 ask for far less).
inline constexpr int64_t kConvWorkspaceLimit = int64_t{1} << 30;

struct ConvPlan {
  std::string key;  // ConvKey of the case
  CudnnPlan plan;
};

// Plans by case for one GPU (or for device properties read from JSON, without a GPU).
class ConvPlanCache {
 public:
  explicit ConvPlanCache(CudnnDescriptor device_properties,
                         int64_t workspace_limit = kConvWorkspaceLimit);
  // The plan of `c`, built on the first call with that case; throws "cuDNN has no engine for
  // convolution <key>: <each configuration offered and why it was passed over>". References stay
  // valid for the cache's life.
  const ConvPlan& Get(const ConvCase& c);
  size_t size() const;
  const CudnnDescriptor& device_properties() const { return device_properties_; }

 private:
  CudnnDescriptor device_properties_;
  int64_t workspace_limit_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<ConvPlan>> plans_;
};

// The tensors of one call, as described at the top (device pointers).
struct ConvTensors {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
};

// Runs `c` on GPU `device`: its plan from that GPU's cache (built on first use), queued on the
// GPU's compute stream with workspace from its context. Throws naming the case when a pointer is
// null or not 16-byte aligned.
void RunConvolution(int device, const ConvCase& c, const ConvTensors& tensors);

}  // namespace cortado::cuda
