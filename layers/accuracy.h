// Accuracy: the fraction of samples whose label is among the top_k scores.
//
// Settings: top_k (1).
// Inputs: scores (N, C) (trailing dimensions of size 1 allowed), label i32 (N) or (N, 1).
// Output: a scalar (shape {}) in the scores' dtype: correct / N (0 for an empty batch).
// Rule (Caffe's, pessimistic on ties): a sample is correct when fewer than top_k other classes
// score greater than or equal to the label's score. So a tie with the label counts against
// it, and a NaN label score is never correct. top_k >= C makes every sample correct.
// Labels outside [0, C) throw naming the layer and the sample.
// No backward: CanBackpropTo is false for every input.
// Device (f32, f64): the shared bodies of layers/loss_kernels.h, a hit flag per sample then one
// ordered count; the result stays on the device (the Net copies scalars back). A label out of
// range makes the accuracy NaN there (a device cannot throw). bf16/f16 on a device: the f32
// bodies on the scores widened there, as the CPU computes them in f32.
#pragma once

#include "engine/graph/typed_layer.h"

namespace cortado {

class AccuracyLayer : public TypedLayer<AccuracyLayer, WideFloatTypes> {
 public:
  using TypedLayer::TypedLayer;
  int MinInputs() const override { return 2; }
  int MaxInputs() const override { return 2; }
  bool CanBackpropTo(int input_index) const override { return false; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 protected:
  // No gradient flows through an accuracy (CanBackpropTo is false): nothing to do, whatever
  // the dtype (BackwardT for f32 and f64; bf16 and f16 here, not computed in f32).
  void BackwardBF16(const Blobs&, const std::vector<bool>&, const Blobs&) override {}
  void BackwardF16(const Blobs&, const std::vector<bool>&, const Blobs&) override {}
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  void ForwardOnDevice(const Blobs& bottom, const Blobs& top) override;
  void BackwardOnDevice(const Blobs&, const std::vector<bool>&, const Blobs&) override {}

 private:
  CORTADO_TYPED_LAYER_KERNELS();
  int64_t top_k_ = 1;
  Tensor hit_;   // i32 (N) on a device: 1 where the sample is correct
  Tensor wide_;  // f32 on a device: bf16/f16 scores widened
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<AccuracyLayer, WideFloatTypes>;

}  // namespace cortado
