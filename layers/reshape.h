// Reshape: the same elements under another shape (Caffe's Reshape; torch.reshape on a dense
// tensor), e.g. a detection head's (N, H, W, A K) as (N, H W A, K).
//
// Settings: shape (required): the output's dimensions, where 0 copies the input's dimension at
// the same position and one -1 takes whatever size makes the element counts agree (Caffe's
// rules), e.g. [0, -1, 21].
// Forward shares the bottom's storage (a view, no copy); backward copies the top grad into the
// bottom grad (the net owns that buffer). Any dtype. On a device the same: a view forward, a
// tensor copy on the device backward (none where the gradients already share memory).
#pragma once

#include <vector>

#include "engine/graph/typed_layer.h"

namespace cortado {

class ReshapeLayer : public TypedLayer<ReshapeLayer, AllDTypes> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  int SharesInputStorage(int) const override { return 0; }
  bool BackwardReadsInputs() const override { return false; }
  bool BackwardReadsOutputs() const override { return false; }

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
  std::vector<int64_t> shape_;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<ReshapeLayer, AllDTypes>;

}  // namespace cortado
