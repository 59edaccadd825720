// BatchNorm: per-channel normalization (nn.BatchNorm2d / nn.BatchNorm1d), optionally
// synchronized across data-parallel ranks.
//
// Settings: eps (1e-5), momentum (0.1: the weight of the new batch, PyTorch's convention),
// affine (true), zero_init (false; true starts gamma at 0, for the last BN of a residual
// block), use_global_stats (default: true in the test phase, false in training), sync
// (synchronized statistics; default: the net-wide setting).
// Shapes: bottom (N, C, *) (e.g. (N, C, H, W) or (N, C)); top has the same shape.
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
#pragma once

#include <vector>

#include "engine/graph/typed_layer.h"

namespace cortado {

class BatchNormLayer : public TypedLayer<BatchNormLayer, AllFloatTypes, KernelArgs::kOneInput> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsOutputs() const override { return false; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  bool UseGlobalStats() const;
  // The reducer this layer synchronizes through, or null for per-rank statistics.
  BatchStatsReducer* Reducer() const;
  // The kernels' T is the activations' storage type; params, statistics and arithmetic in
  // Compute<T> (f32 for bf16 and f16, which thus run natively, without staging copies).
  CORTADO_TYPED_LAYER_ONE_INPUT_KERNELS();

  double eps_ = 1e-5;
  double momentum_ = 0.1;
  bool affine_ = true;
  bool has_sync_setting_ = false;
  bool sync_setting_ = false;
  bool has_global_setting_ = false;
  bool use_global_stats_ = false;
  int64_t channels_ = 0;
  int64_t num_ = 0, spatial_ = 1;  // N, and the product of the dimensions after C
  // From the last Forward: whether it used batch statistics, and the per-channel mean and
  // 1 / sqrt(var + eps) it normalized with; the count of elements per channel (global).
  bool last_used_batch_stats_ = false;
  std::vector<double> mean_, invstd_;
  double count_ = 0;
  std::vector<double> reduce_buf_;  // all-reduce staging
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<BatchNormLayer, AllFloatTypes, KernelArgs::kOneInput>;

}  // namespace cortado
