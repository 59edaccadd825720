// Flatten: collapses the dimensions from `axis` to the end into one (torch.flatten(x, axis)).
//
// Settings: axis (1; negative counts from the end).
// Shapes: bottom (d0, ..., dk) -> top (d0, ..., d[axis-1], d[axis] * ... * dk).
// Forward shares the bottom's storage (a view, no copy); backward copies the top grad into the
// bottom grad (the net owns that buffer). Any dtype. On a device the same: a view forward, a
// tensor copy on the device backward (none where the gradients already share memory).
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
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override { View(bottom, top); }
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override {
    CopyGradient(top, propagate_down, bottom);
  }

 private:
  // Moves bytes only, so one implementation serves every dtype (T is not used).
  CORTADO_TYPED_LAYER_KERNELS();
  Shape TopShape(const Shape& bottom_shape) const;
  // Forward on every device: top = bottom's storage under TopShape.
  void View(const Blobs& bottom, const Blobs& top);
  // Backward on every device: dx = dy unless they share memory.
  void CopyGradient(const Blobs& top, const std::vector<bool>& propagate_down, const Blobs& bottom);
  int64_t axis_ = 1;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<FlattenLayer, AllDTypes>;

}  // namespace cortado
