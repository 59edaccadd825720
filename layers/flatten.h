// Flatten: collapses the dimensions from `axis` to the end into one (torch.flatten(x, axis)).
//
// Settings: axis (1; negative counts from the end).
// Shapes: bottom (d0, ..., dk) -> top (d0, ..., d[axis-1], d[axis] * ... * dk).
// Forward shares the bottom's storage (a view, no copy); backward copies the top grad into the
// bottom grad (the net owns that buffer). Any dtype.
#pragma once

#include "engine/layer.h"

namespace cortado {

class FlattenLayer : public Layer {
 public:
  using Layer::Layer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void Forward(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& propagate_down,
                const std::vector<Blob*>& bottom) override;

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  Shape TopShape(const Shape& bottom_shape) const;
  int64_t axis_ = 1;
};

}  // namespace cortado
