// Split: hands one blob to several consumers. The net inserts it where a blob feeds more than
// one layer, so that each consumer writes its own gradient and Split sums them.
//
// Settings: none. Inputs: 1. Outputs: any number (>= 1).
// Forward: every top shares the bottom's storage (no copy); consumers never write their inputs.
// Backward: bottom grad = sum of the top grads, added in top order (deterministic).
// On a device: forward shares as on the CPU; backward sums with the SumTops body
// (layers/copy_kernels.h), up to 8 tops a pass, in the CPU's order (bf16 and f16 in f32,
// rounded once); one top is a tensor copy.
// Threads: ParallelFor over contiguous element ranges.
#pragma once

#include "engine/graph/typed_layer.h"

namespace cortado {

class SplitLayer : public TypedLayer<SplitLayer, AllFloatTypes> {
 public:
  using TypedLayer::TypedLayer;
  int NumOutputs() const override { return -1; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsInputs() const override { return false; }  // the sum of the top gradients
  int SharesInputStorage(int) const override { return 0; }
  bool TakesChannelsLast() const override { return true; }

 protected:
  // Forward shares storage, so one implementation serves every dtype.
  void ForwardOtherDType(const Blobs& bottom, const Blobs& top) override { Share(bottom, top); }
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override { Share(bottom, top); }
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

 private:
  void Share(const Blobs& bottom, const Blobs& top);
  template <class E>
  void SumOnDevice(const Blobs& top, Tensor& dx);
  Tensor partial_;  // f32 on the device: the running sum of 16-bit tops beyond one pass
  CORTADO_TYPED_LAYER_KERNELS();
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<SplitLayer, AllFloatTypes>;

}  // namespace cortado
