// SoftmaxWithLoss: softmax cross-entropy against integer labels, averaged over the batch
// (nn.CrossEntropyLoss with reduction='mean' and label_smoothing).
//
// Settings: label_smoothing (0.0, in [0, 1)), loss_weight (1.0, read by the Layer base).
// Inputs: logits (N, C) (trailing dimensions of size 1 are allowed, e.g. (N, C, 1, 1)),
// label i32 (N) (or (N, 1)). Output: the loss, a scalar (shape {}), in the logits' dtype.
// With smoothing e the target is (1 - e) one_hot(label) + e / C, so
//   loss_i = (1 - e) (-log p[label_i]) + e / C * sum_c (-log p_c),
// computed stably from the max-subtracted logits; d loss / d logits = (p - target) / N.
// A label outside [0, C) throws naming the layer, the sample and the value.
// No gradient flows to the label (CanBackpropTo(1) is false).
// Threads: ParallelFor over samples; the per-sample losses are summed in sample order.
// Device (f32, f64): the shared bodies of layers/loss_kernels.h, per sample then one ordered sum,
// so the test device's loss and gradient are the CPU's bit for bit; the loss and the gradient's
// scale (the loss's gradient) stay on the device. A label out of range makes the loss NaN there
// (a device cannot throw). bf16/f16 on a device: the f32 bodies on the logits widened there, as
// the CPU computes them in f32.
#pragma once

#include <vector>

#include "engine/graph/typed_layer.h"

namespace cortado {

class SoftmaxWithLossLayer : public TypedLayer<SoftmaxWithLossLayer, WideFloatTypes> {
 public:
  using TypedLayer::TypedLayer;
  int MinInputs() const override { return 2; }
  int MaxInputs() const override { return 2; }
  bool CanBackpropTo(int input_index) const override { return input_index == 0; }
  bool IsLoss() const override { return true; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  bool BackwardReadsInputs() const override { return false; }  // from the saved probabilities

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs& top, const std::vector<bool>& propagate_down,
                        const Blobs& bottom) override;

 private:
  CORTADO_TYPED_LAYER_KERNELS();

  double label_smoothing_ = 0.0;
  int64_t num_ = 0, classes_ = 0;
  Tensor prob_;                      // (N, C) softmax from the last Forward
  std::vector<double> sample_loss_;  // (N)
  Tensor row_loss_;                  // f64 (N) on a device: the per-sample losses there
  Tensor wide_;                      // f32 on a device: bf16/f16 logits or their gradient
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<SoftmaxWithLossLayer, WideFloatTypes>;

}  // namespace cortado
