// Concat: joins 2+ inputs along one axis (torch.cat(inputs, axis)).
//
// Settings: axis (1; negative counts from the end).
// Shapes: every input agrees on all dimensions but `axis`; top's `axis` dimension is the sum.
// 4-d inputs may be channels-last (all in one format; the top takes it): the axis is logical.
// Backward copies each input's slice of the top grad.
// Threads: ParallelFor over the outer dimension (the product of dimensions before `axis`).
#pragma once

#include "engine/graph/typed_layer.h"

namespace cortado {

class ConcatLayer : public TypedLayer<ConcatLayer, AllDTypes> {
 public:
  using TypedLayer::TypedLayer;
  int MinInputs() const override { return 2; }
  int MaxInputs() const override { return -1; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool TakesChannelsLast() const override { return true; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  // Moves bytes only, so one implementation serves every dtype (T is not used).
  CORTADO_TYPED_LAYER_KERNELS();
  int64_t axis_setting_ = 1;
  int axis_ = 1;
  int64_t outer_ = 1, inner_ = 1;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<ConcatLayer, AllDTypes>;

}  // namespace cortado
