// L2Norm: normalizes each position's channel vector to unit L2 length and scales channel c by a
// learned weight[c] (SSD's conv4_3_norm: Caffe SSD's Normalize with across_spatial false and
// channel_shared false; torchvision's `scale_weight * F.normalize(x)` in SSDFeatureExtractorVGG).
//
// Settings: scale_init (20: SSD's and torchvision's initial weight), eps (1e-12: F.normalize's).
// Shapes: bottom (N, C, ...) with any trailing spatial dimensions S; top the same;
//   y[n, c, s] = weight[c] x[n, c, s] / r[n, s],  r = max(||x[n, :, s]||_2, eps).
// Params: <name>.weight (C) (kWeight: decayed like a convolution's, as both references do).
// Backward, with g[c] = weight[c] dy[c] at one position:
//   dx[c] = g[c] / r - x[c] (sum_c' g[c'] x[c']) / r^3   (r = ||x|| > eps; r = eps is a constant)
//   dweight[c] = sum_{n, s} dy[n, c, s] x[n, c, s] / r[n, s].
// Sums over channels are f64 (a few ulps in f32 whatever C). bf16 and f16 compute in f32.
// Threads: ParallelTasks over runs of positions (one static range per thread); the weight
// gradient's per-thread partial sums are added in thread order (deterministic for a thread count).
#pragma once

#include <vector>

#include "engine/graph/typed_layer.h"

namespace cortado {

class L2NormLayer : public TypedLayer<L2NormLayer, WideFloatTypes> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsOutputs() const override { return false; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  CORTADO_TYPED_LAYER_KERNELS();
  double eps_ = 1e-12;
  int64_t num_ = 0, channels_ = 0, spatial_ = 0;
  std::vector<double> inv_norm_;  // (N, S): 1 / r from the last Forward
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<L2NormLayer, WideFloatTypes>;

}  // namespace cortado
