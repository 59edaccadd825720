// Concat: joins 2+ inputs along one axis (torch.cat(inputs, axis)).
//
// Settings: axis (1; negative counts from the end).
// Shapes: every input agrees on all dimensions but `axis`; top's `axis` dimension is the sum.
// 4-d inputs may be channels-last (all in one format; the top takes it): the axis is logical.
// Backward copies each input's slice of the top grad.
// On a device (every dtype): one SliceCopy body (layers/copy_kernels.h) per input, moving the
// widest unit (up to 8 bytes) that the slice's sizes and addresses allow.
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
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

 private:
  // Moves bytes only, so one implementation serves every dtype (T is not used).
  CORTADO_TYPED_LAYER_KERNELS();
  // The device path: input i's slice to the top (forward) or from the top's gradient.
  void CopySlicesOnDevice(const Blobs& bottom, Blob* top, bool to_top,
                          const std::vector<bool>* which);
  int64_t axis_setting_ = 1;
  int axis_ = 1;
  int64_t outer_ = 1, inner_ = 1;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<ConcatLayer, AllDTypes>;

}  // namespace cortado
