// Reorder: the same (N, C, H, W) tensor in another memory format (engine/tensor/tensor.h). The
// net inserts one before a layer that takes NCHW only when its input is channels-last
// (model.layout: nhwc), e.g. an InnerProduct on a 4-d feature map, so that the inner product's
// weights keep torchvision's (C, H, W) order; `cortado inspect` lists them.
//
// Settings: format (nchw | nhwc, required): the output's format.
// Shapes: bottom 4-d (N, C, H, W) in any format; top the same shape in `format`. Other ranks
// pass through as copies (they have no format).
// Backward moves the gradient back into the input's format. Any dtype (bytes only).
// Threads: Tensor::ReorderFrom (ParallelFor over images).
#pragma once

#include "engine/graph/typed_layer.h"

namespace cortado {

class ReorderLayer : public TypedLayer<ReorderLayer, AllDTypes> {
 public:
  using TypedLayer::TypedLayer;
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool TakesChannelsLast() const override { return true; }
  bool BackwardReadsInputs() const override { return false; }
  bool BackwardReadsOutputs() const override { return false; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  CORTADO_TYPED_LAYER_KERNELS();
  MemoryFormat format_ = MemoryFormat::kNCHW;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<ReorderLayer, AllDTypes>;

}  // namespace cortado
