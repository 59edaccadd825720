// MultiBoxLoss: SSD's training loss (Caffe SSD's MultiBoxLoss; torchvision's SSD.compute_loss,
// whose rules it follows so that the same inputs give the same loss and gradients).
//
// Inputs: cls_logits (N, P, C) (class 0 the background), bbox_regression (N, P, 4) (encoded
// offsets, see layers/box_util.h), priors (P, 4) (cx, cy, w, h), the ground truth (1, 1, G, 8)
// (layers/box_util.h; any float dtype), and optionally per-prior variances (P, 4) (else the
// `variance` setting). Output: the loss, a scalar, f32 (f64 in an f64 net).
// For each image, in order:
//   1. Matching: each prior takes the ground-truth box it overlaps most if that IoU is at least
//      overlap_threshold (0.5); then each box takes the prior it overlaps most, whatever the IoU
//      (a later box wins a prior two boxes share, as in torchvision's SSDMatcher). Matched priors
//      are positives; their class target is the box's class, every other prior's is 0.
//   2. Localization: smooth L1 (beta 1) between the positives' regressions and their boxes
//      encoded against the prior with the variances.
//   3. Confidence: softmax cross-entropy; hard negative mining keeps, besides the positives, the
//      ceil(neg_pos_ratio x positives) unmatched priors (3:1; at most all of them) with the
//      largest cross-entropy (ties: the lower prior index). An image without boxes contributes
//      nothing.
// loss = (loc_weight sum_loc + sum_conf) / max(1, positives in the batch).
// Backward: d/dlogits = (softmax - one_hot(target)) / M on the kept priors, 0 elsewhere;
// d/dregression = clamp(regression - target, -1, 1) loc_weight / M on the positives, 0 elsewhere
// (times the loss's gradient); the matching and the kept set are those of the last Forward. No
// gradient flows to the priors, the ground truth or the variances.
// Settings: overlap_threshold (0.5), neg_pos_ratio (3), loc_weight (1), variance ([0.1, 0.1,
// 0.2, 0.2]), use_difficult_gt (true: boxes marked difficult are matched like the others, as
// Caffe SSD trains; false: they are left out), loss_weight (1).
// Threads: ParallelFor over images; per-image sums are added in image order.
#pragma once

#include <vector>

#include "engine/graph/typed_layer.h"
#include "layers/box_util.h"

namespace cortado {

class MultiBoxLossLayer : public TypedLayer<MultiBoxLossLayer, WideFloatTypes> {
 public:
  using TypedLayer::TypedLayer;
  int MinInputs() const override { return 4; }
  int MaxInputs() const override { return 5; }
  bool CanBackpropTo(int input_index) const override { return input_index < 2; }
  bool IsLoss() const override { return true; }
  bool BackwardReadsOutputs() const override { return false; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  // Positives (matched priors) of the last Forward, over the batch.
  int64_t num_matched() const { return num_matched_; }

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  CORTADO_TYPED_LAYER_KERNELS();

  double overlap_threshold_ = 0.5;
  double neg_pos_ratio_ = 3.0;
  double loc_weight_ = 1.0;
  box::Variance variance_ = box::kSsdVariance;
  bool use_difficult_ = true;
  int64_t num_ = 0, priors_ = 0, classes_ = 0;
  // From the last Forward: the batch's boxes, the priors and variances, each prior's matched
  // box (index into gt_, -1: none) and class target (-1: not kept for the confidence loss).
  std::vector<box::GroundTruth> gt_;
  std::vector<box::CenterSize> prior_boxes_;
  std::vector<box::Variance> variances_;
  std::vector<int32_t> match_;   // (N, P)
  std::vector<int32_t> target_;  // (N, P)
  int64_t num_matched_ = 0;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<MultiBoxLossLayer, WideFloatTypes>;

}  // namespace cortado
