// PriorBox: SSD's default boxes ("priors") for every feature map of a detector, in one layer, in
// torchvision's DefaultBoxGenerator convention or in Caffe SSD's PriorBox convention.
//
// Inputs: the feature maps f_1 .. f_k (N, C_k, H_k, W_k), of which only H_k and W_k are read,
// then the image (N, C, H, W) for its size, unless `image_size` gives it (then every input is a
// feature map). Outputs: priors (P, 4), rows (cx, cy, w, h) normalized to the image, in f32
// (f64 in an f64 net; f32 in a bf16 or f16 one, whose 8 bits would misplace a box by a pixel),
// and optionally, as Caffe SSD's PriorBox gives them beside the boxes, their variances (P, 4),
// every row the `variance` setting, for MultiBoxLoss' and DetectionOutput's optional variance
// input. The priors are ordered map by map, position by position (row-major), box by box:
//   torchvision: scale s_k, then sqrt(s_k s_{k+1}), then for each aspect ratio a: (s_k sqrt(a),
//                s_k / sqrt(a)) and the same turned (w and h swapped);
//   caffe:       min_size, then sqrt(min_size max_size) when max_sizes is given, then for each
//                aspect ratio a (1 and repeats skipped): (min_size sqrt(a), min_size / sqrt(a)),
//                followed by 1/a when `flip`.
// Centers: torchvision's ((j + 0.5) / (image / step)), from the grid size ((j + 0.5) / W_k) when
// no steps are given; Caffe's ((j + offset) step / image), with step = image / W_k when none is
// given. In an f32 net torchvision's centers and sizes are rounded as torchvision's f32 code
// rounds them, so ssd300_vgg16's 8732 priors equal torchvision's bit for bit.
//
// Settings:
//   convention: torchvision (default) | caffe
//   aspect_ratios ([2]): one list for every map, or, with aspect_ratios_per_map (counts, one per
//     map), the maps' lists one after another: SSD300's [[2], [2, 3], [2, 3], [2, 3], [2], [2]]
//     is aspect_ratios [2, 2, 3, 2, 3, 2, 3, 2, 2] with aspect_ratios_per_map [1, 2, 2, 2, 1, 1].
//   steps (k numbers, pixels; optional), image_size (n or [h, w]; optional, see Inputs),
//   clip: torchvision (default true) clamps each prior's w and h to [0, 1]; caffe (default false)
//     clamps its corners to [0, 1].
//   torchvision only: scales (k + 1 numbers) or min_ratio (0.15) and max_ratio (0.9), from which
//     scales are spread evenly over the maps, followed by 1.0 (DefaultBoxGenerator's rule).
//   caffe only: min_sizes (k numbers, pixels, required), max_sizes (k, optional), offset (0.5),
//     flip (true).
//   variance ([0.1, 0.1, 0.2, 0.2]): the second output's rows.
// No gradient flows: the priors depend on the shapes alone.
#pragma once

#include <vector>

#include "engine/graph/typed_layer.h"

namespace cortado {

class PriorBoxLayer : public TypedLayer<PriorBoxLayer, AllFloatTypes> {
 public:
  using TypedLayer::TypedLayer;
  int MinInputs() const override { return 1; }
  int MaxInputs() const override { return -1; }
  int NumOutputs() const override { return -1; }  // priors, and optionally their variances
  bool CanBackpropTo(int) const override { return false; }
  bool BackwardReadsInputs() const override { return false; }
  bool BackwardReadsOutputs() const override { return false; }
  void Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;
  // Boxes per position of each feature map (the head's A_k).
  std::vector<int64_t> BoxesPerPosition() const;

 protected:
  void LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override;

 private:
  CORTADO_TYPED_LAYER_KERNELS();
  // The priors for maps of sizes (H_k, W_k) on an image_h x image_w image; f32_rounding rounds
  // as torchvision's f32 code does.
  std::vector<double> Generate(const std::vector<std::pair<int64_t, int64_t>>& maps, double image_h,
                               double image_w, bool f32_rounding) const;

  bool caffe_ = false;
  int64_t maps_ = 0;
  std::vector<std::vector<double>> ratios_;  // per map
  std::vector<double> steps_;                // per map, or empty
  std::vector<int64_t> image_size_;          // {h, w}, or empty: the last input
  bool clip_ = true;
  std::vector<double> scales_;                 // torchvision: k + 1
  std::vector<double> min_sizes_, max_sizes_;  // caffe
  double offset_ = 0.5;
  bool flip_ = true;
  std::vector<double> variance_;
  // The priors of the current shapes (f64), and what they were made for.
  std::vector<double> priors_;
  std::vector<int64_t> made_for_;
};
// Instantiated in the .cpp, where the kernels are defined.
extern template class TypedLayer<PriorBoxLayer, AllFloatTypes>;

}  // namespace cortado
