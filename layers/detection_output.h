// DetectionOutput: SSD's detections from the head's outputs (Caffe SSD's DetectionOutput;
// torchvision's SSD.postprocess_detections, whose rules it follows). Inference only.
//
// Inputs: cls_logits (N, P, C) (class 0 the background), bbox_regression (N, P, 4), priors
// (P, 4) (cx, cy, w, h), and optionally per-prior variances (P, 4) (else `variance`).
// Output: (1, 1, D, 7) rows [item_id, class_label, score, xmin, ymin, xmax, ymax], coordinates
// normalized to the image, f32 (f64 in an f64 net); an image's rows by descending score, images
// in batch order. D is known only after Forward: Reshape sizes the output for the most rows
// there can be, and Forward shrinks it to D (D = 0 when nothing passes).
// For each image: the scores are the softmax of the logits; each prior's box is decoded
// (layers/box_util.h) and, with `clip`, clamped to [0, 1]. For each class but the background:
// the priors scoring above confidence_threshold, the top_k best of them, then greedy non-maximum
// suppression (a box is dropped when its IoU with a kept, higher-scoring box of its class exceeds
// nms_threshold). Of all classes' survivors the keep_top_k best are kept.
// In the train phase the output has no rows: training never reads detections, and the
// suppression, on an untrained net's near-uniform scores, would cost more than the step.
// Settings: confidence_threshold (0.01), nms_threshold (0.45), top_k (400; 0: all),
// keep_top_k (200; 0: all), clip (true), variance ([0.1, 0.1, 0.2, 0.2]); the defaults are
// torchvision's ssd300_vgg16's and Caffe SSD's VOC ones.
// Threads: ParallelFor over images.
#pragma once

#include <vector>

#include "engine/graph/typed_layer.h"
#include "layers/box_util.h"

namespace cortado {

class DetectionOutputLayer : public TypedLayer<DetectionOutputLayer, AllFloatTypes> {
 public:
  using TypedLayer::TypedLayer;
  int MinInputs() const override { return 3; }
  int MaxInputs() const override { return 4; }
  bool CanBackpropTo(int) const override { return false; }
  bool BackwardReadsInputs() const override { return false; }
  bool BackwardReadsOutputs() const override { return false; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  CORTADO_TYPED_LAYER_KERNELS();

  double confidence_threshold_ = 0.01;
  double nms_threshold_ = 0.45;
  int64_t top_k_ = 400, keep_top_k_ = 200;
  bool clip_ = true;
  box::Variance variance_ = box::kSsdVariance;
  int64_t num_ = 0, priors_ = 0, classes_ = 0;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<DetectionOutputLayer, AllFloatTypes>;

}  // namespace cortado
