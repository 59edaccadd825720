// Concat: joins 2+ inputs along one axis (torch.cat(inputs, axis)).
//
// Settings: axis (1; negative counts from the end).
// Shapes: every input agrees on all dimensions but `axis`; top's `axis` dimension is the sum.
// Backward copies each input's slice of the top grad.
// Threads: ParallelFor over the outer dimension (the product of dimensions before `axis`).
#pragma once

#include "engine/layer.h"

namespace cortado {

class ConcatLayer : public Layer {
 public:
  using Layer::Layer;
  int MinInputs() const override { return 2; }
  int MaxInputs() const override { return -1; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void Forward(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& propagate_down,
                const std::vector<Blob*>& bottom) override;

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  int64_t axis_setting_ = 1;
  int axis_ = 1;
  int64_t outer_ = 1, inner_ = 1;
};

}  // namespace cortado
