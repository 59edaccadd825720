// Split: hands one blob to several consumers. The net inserts it where a blob feeds more than
// one layer, so that each consumer writes its own gradient and Split sums them.
//
// Settings: none. Inputs: 1. Outputs: any number (>= 1).
// Forward: every top shares the bottom's storage (no copy); consumers never write their inputs.
// Backward: bottom grad = sum of the top grads, added in top order (deterministic).
// Threads: ParallelFor over contiguous element ranges.
#pragma once

#include "engine/layer.h"

namespace cortado {

class SplitLayer : public Layer {
 public:
  using Layer::Layer;
  int NumOutputs() const override { return -1; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void Forward(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& propagate_down,
                const std::vector<Blob*>& bottom) override;

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
};

}  // namespace cortado
