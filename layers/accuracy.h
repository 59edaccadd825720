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

 private:
  CORTADO_TYPED_LAYER_KERNELS();
  int64_t top_k_ = 1;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<AccuracyLayer, WideFloatTypes>;

}  // namespace cortado
