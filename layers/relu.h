// ReLU: y = x for x > 0, negative_slope * x otherwise (leaky when negative_slope != 0).
//
// Settings: negative_slope (0.0).
// Shapes: any; top has bottom's shape. Backward uses the input's sign (x > 0), which for
// slope 0 is PyTorch's rule (the gradient at exactly 0 is 0).
// Threads: ParallelFor over contiguous element ranges.
#pragma once

#include "engine/layer.h"

namespace cortado {

class ReluLayer : public Layer {
 public:
  using Layer::Layer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void Forward(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& propagate_down,
                const std::vector<Blob*>& bottom) override;

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  double negative_slope_ = 0.0;
};

}  // namespace cortado
