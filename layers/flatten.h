// Flatten: collapses the dimensions from `axis` to the end into one (torch.flatten(x, axis)).
//
// Settings: axis (1; negative counts from the end).
// Shapes: bottom (d0, ..., dk) -> top (d0, ..., d[axis-1], d[axis] * ... * dk).
// Forward shares the bottom's storage (a view, no copy); backward copies the top grad into the
// bottom grad (the net owns that buffer). Any dtype.
#pragma once

#include "engine/graph/typed_layer.h"

namespace cortado {

class FlattenLayer : public TypedLayer<FlattenLayer, AllDTypes> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  int SharesInputStorage(int) const override { return 0; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  // Moves bytes only, so one implementation serves every dtype (T is not used).
  CORTADO_TYPED_LAYER_KERNELS();
  Shape TopShape(const Shape& bottom_shape) const;
  int64_t axis_ = 1;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<FlattenLayer, AllDTypes>;

}  // namespace cortado
