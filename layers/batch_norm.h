// BatchNorm: per-channel normalization (nn.BatchNorm2d / nn.BatchNorm1d), optionally
// synchronized across data-parallel ranks.
//
// Settings: eps (1e-5), momentum (0.1: the weight of the new batch, PyTorch's convention),
// affine (true), zero_init (false; true starts gamma at 0, for the last BN of a residual
// block), use_global_stats (default: true in the test phase, false in training), sync
// (synchronized statistics; default: the net-wide setting), relu (false: a ReLU fused into
// the layer, y = max(BN(x), 0); the net's fusion rewrite sets it where a ReLU alone reads the
// output, engine/graph/net.h).
// Shapes: bottom (N, C, *) (e.g. (N, C, H, W) or (N, C)); top has the same shape. A 4-d input
// may be channels-last (NHWC): the statistics then run over rows of C contiguous channels,
// vectorized across channels, in fixed blocks of rows whose partial sums are added in block
// order (the same sums at any thread count).
//
// Fused ReLU: forward writes max(z, 0) with z the normalized value, in the same pass; backward
// recomputes z from x (instead of reading y, one stream less) and masks dy where the stored
// output is not positive, then runs batch norm's backward on the masked gradient, all in the
// two passes batch norm's backward has anyway. The arithmetic is the unfused pair's, in the
// same order, so fused and unfused results are bitwise equal (tests/layers/fusion_test.cpp).
// Params (affine only): <name>.weight (gamma, init 1) and <name>.bias (beta, init 0), both
// ParamKind::kNorm. Buffers: <name>.running_mean (init 0), <name>.running_var (init 1).
//
// Training (batch statistics): mean and biased variance over N and the spatial positions;
//   y = gamma (x - mean) / sqrt(var + eps) + beta;
//   running_mean <- (1 - momentum) running_mean + momentum mean,
//   running_var  <- (1 - momentum) running_var  + momentum var * n / (n - 1) (unbiased).
// With use_global_stats the running statistics are used instead and are not updated.
//
// Synchronized BN (setting `sync`, default: the net-wide distributed.sync_bn): with a
// reducer in the context (LayerContext::batch_stats, the data-parallel glue's), forward sums
// the per-channel [sum x, sum x^2, count] over the batch-norm group in one call and backward the
// per-channel [sum dy, sum dy (x - mean)] in one call, so statistics and input gradients are
// those of the group's combined batch, weighted by each rank's count (a short batch weighs
// less). Parameter gradients stay local (the data-parallel all-reduce averages them like every
// other gradient), as in torch.nn.SyncBatchNorm. Reductions run on Forward/Backward's own
// thread, never inside a pool task.
//
// Numerics: the per-channel sums are accumulated in double (as PyTorch's CPU kernels do), so
// var = E[x^2] - E[x]^2 does not cancel when |mean| >> std; synchronized, they travel as f64
// too, so the group's statistics equal a single process's on the combined batch to rounding.
// Threads: ParallelFor over channels (statistics) and over planes (elementwise passes).
//
// On a device (f32, f64): the shared bodies of layers/batch_norm_kernels.h, whose sums are the
// CPU's in the CPU's order, so a device's results are the CPU's bit for bit. The statistics and
// coefficients stay on the device; synchronized, the 2 C per-channel sums come to the host in one
// copy, are all-reduced there as on the CPU, and go back in one copy. bf16 and f16 run the same
// bodies through their element codes (layers/element_codes.h): widened on load, statistics in
// f64, the rest in f32 as the CPU's 16-bit kernels, stored rounded once, the fused ReLU's
// backward masking where the stored 16-bit output is 0: bit for bit the CPU's too.
#pragma once

#include <string>
#include <vector>

#include "engine/graph/typed_layer.h"
#include "layers/layer_util.h"

namespace cortado {

class BatchNormLayer : public TypedLayer<BatchNormLayer, AllFloatTypes, KernelArgs::kOneInput> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsOutputs() const override { return false; }
  bool TakesChannelsLast() const override { return true; }
  std::string Note() const override;

  // For a convolution that folds this layer into its weights at inference (ConvolutionLayer::
  // AbsorbNext): whether forward normalizes with the running statistics in this net, and the
  // per-channel scale gamma / sqrt(running_var + eps) and shift beta - mean * scale it applies
  // then, in double; and whether a ReLU is fused.
  bool UsesRunningStatistics() const { return UseGlobalStats(); }
  void InferenceAffine(std::vector<double>* scale, std::vector<double>* shift) const;
  bool fused_relu() const { return relu_; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

 private:
  bool UseGlobalStats() const;
  // The reducer this layer synchronizes through, or null for per-rank statistics.
  BatchStatsReducer* Reducer() const;
  // The kernels' T is the activations' storage type; params, statistics and arithmetic in
  // Compute<T> (f32 for bf16 and f16, which thus run natively, without staging copies).
  CORTADO_TYPED_LAYER_ONE_INPUT_KERNELS();
  // Per-channel sums of x and x^2 into s1, s2 (NCHW and channels-last).
  template <typename S>
  void ForwardSums(const S* x, bool nhwc, std::vector<double>& s1, std::vector<double>& s2);
  // y = [relu](a (x - m) + b) per channel.
  template <typename S, bool kRelu>
  void Normalize(const S* x, bool nhwc, const std::vector<Compute<S>>& a,
                 const std::vector<Compute<S>>& m, const std::vector<Compute<S>>& b, S* y);
  // Per-channel sums of g and g (x - mean), g = dy (masked where the fused ReLU's output is 0).
  template <typename S, bool kRelu>
  void BackwardSums(const S* x, const S* dy, bool nhwc, std::vector<double>& sdy,
                    std::vector<double>& sdyx);
  // dx = A g + B (x - mean) + C per channel.
  template <typename S, bool kRelu>
  void InputGradient(const S* x, const S* dy, bool nhwc, const std::vector<double>& coef_a,
                     const std::vector<double>& coef_b, const std::vector<double>& coef_c, S* dx);
  // The device's kernels (E: the element codes of x's dtype, layers/element_codes.h) and their
  // per-channel sums of x (forward, dy null) or of g and g (x - mean) (backward) into dev_sums_.
  template <class E>
  void DeviceForward(const Tensor& x, Tensor& y);
  template <class E>
  void DeviceBackward(const Tensor& x, const Tensor& dy, bool propagate, Tensor* dx);
  template <class E>
  void DeviceSums(const Tensor& x, const Tensor* dy);
  // dev_sums_ (2 C, plus `count` when count is not null) all-reduced through `reducer` on the
  // host: one copy there, one back.
  void AllReduceDeviceSums(BatchStatsReducer& reducer, double* count);
  // The per-channel a (gamma invstd), mean and b (beta) of the last forward, in T.
  template <typename T>
  void ForwardAffine(std::vector<T>& a, std::vector<T>& m, std::vector<T>& b) const;

  double eps_ = 1e-5;
  double momentum_ = 0.1;
  bool affine_ = true;
  bool has_sync_setting_ = false;
  bool sync_setting_ = false;
  bool has_global_setting_ = false;
  bool use_global_stats_ = false;
  bool relu_ = false;
  int64_t channels_ = 0;
  int64_t num_ = 0, spatial_ = 1;  // N, and the product of the dimensions after C
  // From the last Forward: whether it used batch statistics, and the per-channel mean and
  // 1 / sqrt(var + eps) it normalized with; the count of elements per channel (global).
  bool last_used_batch_stats_ = false;
  std::vector<double> mean_, invstd_;
  double count_ = 0;
  std::vector<double> reduce_buf_;  // all-reduce staging
  std::vector<double> partials_;    // channels-last sums: one row of 2 C per block of rows
  // On a device: partial sums (2 C per plane or block of rows), the sums (2 C), the last
  // forward's [mean | invstd] (f64) and [gamma invstd | mean | beta], and the input gradient's
  // coefficients (3 C, in the activations' dtype).
  Tensor dev_part_, dev_sums_, dev_stats_, dev_affine_, dev_coef_;
  Tensor host_sums_;  // the sums' host copy, synchronized (2 C + 1: the count last)
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<BatchNormLayer, AllFloatTypes, KernelArgs::kOneInput>;

}  // namespace cortado
