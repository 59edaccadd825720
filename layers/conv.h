// Convolution: 2-d cross-correlation with stride, zero padding, dilation and groups
// (nn.Conv2d), computed as im2col + GEMM.
//
// Settings: num_output (required), kernel (required; n or [h, w]), stride (1), pad (0),
// dilation (1), groups (1), bias (true), weight_init (kaiming_uniform | kaiming_normal; see
// layer_util.h).
// Shapes: bottom (N, C_in, H, W); weight (C_out, C_in / groups, kh, kw) (OIHW, as PyTorch);
// bias (C_out); top (N, C_out, H_out, W_out) with
//   H_out = (H + 2 pad_h - dilation_h (kh - 1) - 1) / stride_h + 1   (and W alike).
// Params: <name>.weight (kWeight), <name>.bias (kBias).
//
// How it runs. Images are split into one contiguous range per thread (ParallelTasks); each
// thread works through its range in blocks of B images. For a block, im2col writes a column
// matrix (C_in kh kw, B P) with P = H_out W_out, and one GEMM per group computes
// (C_out/g, B P) = W_g (C_out/g, C_in/g kh kw) * col_g. B > 1 only when P is small (deep
// layers on small images), so that each GEMM is wide enough to run near peak. A 1x1 kernel
// with stride 1 and no padding skips im2col (the input already is the column matrix). A
// strided convolution first splits each image into phase planes (coordinates mod stride), on
// which every tap is a stride-1 shift, so im2col and col2im copy contiguous runs (those kernels:
// layers/im2col.h).
// Backward recomputes the columns (cheaper than keeping them for the whole batch) and
// accumulates the weight and bias gradients into per-thread buffers that are summed in thread
// order afterwards: results are deterministic for a given thread count. The input gradient is
// W^T * dY followed by col2im.
// A stride-1 convolution whose column matrix for one image would exceed the column budget
// (a 3x3 convolution on a 224x224 image with 64 channels: 29 M elements) runs each image in
// bands of output rows (im2col::RowBand), as many rows as fit in the budget, so its buffer
// holds a band, not the image: VGG-16's per-thread column buffer is 16 MB
// instead of 116 MB, in training and inference alike. Backward accumulates the weight
// gradient over the bands and adds each band's columns back into the input gradient.
// Workspaces (columns, phase planes, gathered outputs, gradient partials), one set per thread,
// are the net's shared scratch (LayerContext::scratch: the layers of a net run one at a time, so
// every convolution uses the same buffers); only a layer outside a net keeps its own. They are
// kept across calls, so steady-state steps allocate nothing.
//
// Channels-last (NHWC) inputs (model.layout: nhwc) take the fast path: oneDNN's direct
// convolutions, forward, backward-data and backward-weights (engine/graph/conv_onednn.h), f32,
// bf16 (native where the CPU has AVX512_BF16, else widened to f32) and f16 (widened); the
// output is channels-last too. The OIHW parameter stays the truth: each use reorders it into
// oneDNN's format in a buffer the net's convolutions share (an inference net keeps its own copy,
// reordered again when Net::ParamsChanged says so). A geometry or dtype oneDNN has no fast kernel
// for (f64; shapes where it offers only its reference kernel) runs the im2col path above on
// NCHW copies of its tensors, and the layer logs why once (KernelInfo() says it too). In an
// inference net (NetOptions::fuse) the convolution absorbs a following BatchNorm (its running
// statistics folded into the weights and bias at each reorder: w' = w gamma / sqrt(var + eps), b' =
// (b - mean) gamma / sqrt(var + eps) + beta) and ReLU (a post-op of the primitive).
//
// On a device (f32; f64 on the test device) the layer runs its own passes, ConvOnDevice: cuDNN on
// a GPU, the direct reference bodies of layers/conv_kernels.h on the test device (which has no
// cuDNN), with the bias and its gradient as shared bodies on both. Channels-last activations take
// OHWI filters (cuDNN's fast kernels want them): a private device copy of the weights, reordered
// from the OIHW parameter at every forward of a training net (once per step, after the solver's
// update; an inference net only when LayerContext::params_version moves), and the weight gradient
// comes out OHWI into a private buffer that is reordered into the OIHW gradient. The parameter and
// checkpoints stay OIHW. Gradients are overwritten, as on the CPU. bf16/f16 activations take the
// CPU's mixed precision: f32 master weights rounded into a 16-bit device copy, products summed in
// f32, y and dx rounded once (the bias added in f32 before), the weight and bias gradients in f32
// (on a GPU cuDNN's one dtype per pass rounds y before the bias and the weight gradient to 16
// bits first). A convolution that absorbed the layer after it runs Layer's default there (the CPU
// kernel inside one test-device kernel; refused on a GPU).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "engine/graph/conv_onednn.h"
#include "engine/graph/typed_layer.h"
#include "layers/conv_kernels.h"
#include "layers/im2col.h"

namespace cortado {

class ConvolutionLayer;
class BatchNormLayer;
extern template class TypedLayer<ConvolutionLayer, AllFloatTypes, KernelArgs::kOneInput>;

// bf16 and f16: 16-bit activations and columns, products accumulated in f32 (native bf16 GEMM
// where the CPU has it, engine/graph/gemm_lowp.h), f32 parameters and gradients.
class ConvolutionLayer : public TypedLayer<ConvolutionLayer, AllFloatTypes, KernelArgs::kOneInput> {
  friend TypedLayer;  // calls ForwardT and BackwardT

 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsOutputs() const override { return false; }
  bool TakesChannelsLast() const override { return true; }
  bool AbsorbNext(Layer& next) override;
  std::string Note() const override;
  std::string KernelInfo() const override;
  // Whether the channels-last fast path (oneDNN) runs this layer at the current shapes.
  bool fast_path() const { return fast_ready_; }

  // Images per GEMM block for the current shape (exposed for tests and profiles).
  int64_t block_images() const { return block_; }
  // Output rows per band (the output height when the image runs whole).
  int64_t band_rows() const { return band_rows_; }
  // Elements of one thread's column buffer above which an image runs in bands (4 Mi; tests
  // lower it to run small images in bands). Process-wide; set before a net is built.
  static int64_t column_budget();
  static void SetColumnBudgetForTesting(int64_t elements);
  double ForwardFlops() const override;
  // The convolution at the current shapes as a device runs it (the input's format from the last
  // Reshape; OHWI filters with NHWC activations).
  ConvDims device_dims() const;

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

 private:
  template <typename T>
  void ForwardT(const Tensor& x, Tensor& y);
  template <typename T>
  void BackwardT(const Tensor& x, const Tensor& dy, bool propagate, Tensor* dx);
  // Per-thread workspace of at least `elements` elements of T.
  template <typename T>
  T* Workspace(std::vector<Tensor>& pool, int thread, int64_t elements);

  int64_t num_output_ = 0, channels_ = 0, groups_ = 1;
  int64_t kernel_h_ = 0, kernel_w_ = 0, stride_h_ = 1, stride_w_ = 1, pad_h_ = 0, pad_w_ = 0;
  int64_t dilation_h_ = 1, dilation_w_ = 1;
  bool has_bias_ = true;
  bool is_1x1_ = false;  // 1x1 kernel, stride 1, no padding: no im2col needed
  ConvGeometry geo_{};
  int64_t block_ = 1;      // images per GEMM
  int64_t band_rows_ = 0;  // output rows per band: geo_.oh unless the image runs in bands
  int64_t batch_ = 0;      // images at the current shape
  // Workspaces by kind, per thread: the net's shared ones (LayerContext::scratch), else the
  // layer's own. Each kind keeps one dtype (a kind used in two would be reallocated per call):
  // columns, phase planes and the gathered top gradient in the storage type; GEMM outputs,
  // weight- and bias-gradient partials, and the 16-bit backward's dcol and image gradient in
  // the accumulation type.
  enum Scratch {
    kColumns,
    kOutputs,
    kGathered,
    kPhases,
    kWeightGrads,
    kBiasGrads,
    kWideColumns,
    kWideImage,
    kFastWeights,   // channels-last: the weights in oneDNN's format (one buffer, slot 0)
    kFastPartials,  // channels-last: per-thread weight-gradient partials
    kFastStaging,   // channels-last, widened 16-bit: per-thread f32 activations
    kScratchKinds
  };
  std::vector<Tensor>& Workspaces(Scratch kind);
  std::array<std::vector<Tensor>, kScratchKinds> own_workspaces_;
  // The 16-bit copy of the weight the bf16/f16 kernels read: the net's shared one, else own.
  Tensor& WeightCopy();
  Tensor own_weight_copy_;

  // The channels-last path.
  template <typename T>
  void ForwardChannelsLast(const Tensor& x, Tensor& y);
  template <typename T>
  void BackwardChannelsLast(const Tensor& x, const Tensor& dy, bool propagate, Tensor* dx);
  // Prepares fast_ for the current geometry and input dtype (once per change), logging a
  // fall-back.
  void PrepareFast(DType dtype);
  ConvScratch FastScratch();
  std::unique_ptr<ChannelsLastConv> fast_;
  ConvShape fast_shape_{};
  DType fast_dtype_ = DType::kF32;
  bool fast_tried_ = false, fast_ready_ = false;
  std::string fast_why_;  // why the fast path does not run (fall-back), once tried
  // Inference fusion: the batch norm folded into this convolution, and a ReLU post-op.
  BatchNormLayer* folded_bn_ = nullptr;
  bool relu_post_ = false;
  uint64_t weights_version_ = 0;  // LayerContext::params_version of the kept reordered copy
  std::vector<float> fold_scale_, fold_bias_;

  // The device path. Whether it runs the layer's own passes for this input (else Layer's
  // default); refuses f64 on a GPU naming the layer.
  bool OwnDevicePath(const Tensor& x) const;
  // One pass in cuDNN's terms (x, w, y; backward data writes x's place, backward filter w's):
  // cuDNN on a GPU, the reference bodies on the test device.
  // The forward takes `bias` (null without one), added before y is stored.
  void ConvOnDevice(ConvPassKind pass, const Tensor& x, const Tensor& w, const Tensor& y,
                    const Tensor* bias = nullptr);
  // The filter as the device pass reads it: the OIHW parameter, or with NHWC activations the
  // OHWI copy (reordered again by a training forward, or when params_version moved).
  const Tensor& DeviceFilter(bool forward);
  bool nhwc_ = false;          // the input's format at the last Reshape
  Tensor ohwi_weights_;        // channels-last on a device: the weights as OHWI
  Tensor ohwi_gradient_;       // and their gradient, before it is reordered into the OIHW one
  uint64_t ohwi_version_ = 0;  // LayerContext::params_version of ohwi_weights_
  // 16-bit activations: the device filter rounded to their dtype (the CPU's LowPrecisionCopy),
  // and on a GPU the 16-bit weight gradient cuDNN writes before it is widened into the f32 one.
  const Tensor& LowPrecisionFilter(const Tensor& filter, DType dtype);
  Tensor lowp_filter_;
  Tensor lowp_gradient_;
};

}  // namespace cortado
