// Permute: reorders the dimensions of its input (torch.permute(x, order)); Caffe SSD's Permute,
// which turns a detection head's (N, A K, H, W) into (N, H, W, A K) before it is reshaped to
// (N, H W A, K).
//
// Settings: order (required): a permutation of 0 .. ndim-1; output dimension i is input
// dimension order[i].
// Shapes: bottom (d0, ..., dk) -> top (d[order[0]], ..., d[order[k]]), a dense copy.
// Backward scatters the top gradient back through the inverse permutation. Any dtype (bytes are
// moved, nothing is computed).
// Threads: ParallelFor over the output's elements in contiguous chunks.
#pragma once

#include <vector>

#include "engine/graph/typed_layer.h"

namespace cortado {

class PermuteLayer : public TypedLayer<PermuteLayer, AllDTypes> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsInputs() const override { return false; }
  bool BackwardReadsOutputs() const override { return false; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  // Moves bytes only, so one implementation serves every dtype (T is not used).
  CORTADO_TYPED_LAYER_KERNELS();
  std::vector<int64_t> order_;
  Shape out_shape_;
  std::vector<int64_t> in_strides_;  // by output dimension: the input's stride along it
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<PermuteLayer, AllDTypes>;

}  // namespace cortado
