// Boxes for the detection layers (PriorBox, MultiBoxLoss, DetectionOutput): corner and
// center-size forms, IoU, the SSD box coding, and the batch's ground truth read from its tensor.
//
// Coordinates are normalized to the image ([0, 1], boxes may reach past the border); all the
// arithmetic here is f64 whatever the net's dtype, so matching and decoding decide the same in an
// f32 and an f64 net.
//
// Box coding (torchvision's BoxCoder with weights (10, 10, 5, 5), which is Caffe SSD's
// CENTER_SIZE coding with variances v = (0.1, 0.1, 0.2, 0.2)): a box g against a prior p, both
// (cx, cy, w, h), is
//   t = ((g.cx - p.cx) / p.w / v0, (g.cy - p.cy) / p.h / v1, log(g.w / p.w) / v2,
//        log(g.h / p.h) / v3),
// and decoding inverts it, with the size terms t2 v2 and t3 v3 capped at log(1000 / 16) as
// torchvision caps them (an untrained net's exp would overflow).
//
// Ground truth (docs/DETECTION.md; the loader's `label`): f32 (or any float dtype) of shape
// (1, 1, G, 8), each row [item_id, class_label, instance_id, xmin, ymin, xmax, ymax, difficult];
// G may be 0, and rows with item_id < 0 (Caffe's single row of -1s for a batch without boxes)
// are skipped. Header-only; nothing here holds state.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/graph/layer.h"
#include "engine/tensor/tensor.h"
#include "layers/layer_util.h"

namespace cortado::box {

struct Corners {
  double xmin = 0, ymin = 0, xmax = 0, ymax = 0;
};

struct CenterSize {
  double cx = 0, cy = 0, w = 0, h = 0;
};

inline Corners ToCorners(const CenterSize& b) {
  return {b.cx - 0.5 * b.w, b.cy - 0.5 * b.h, b.cx + 0.5 * b.w, b.cy + 0.5 * b.h};
}

inline CenterSize ToCenterSize(const Corners& b) {
  const double w = b.xmax - b.xmin, h = b.ymax - b.ymin;
  return {b.xmin + 0.5 * w, b.ymin + 0.5 * h, w, h};
}

inline double Area(const Corners& b) {
  return std::max(0.0, b.xmax - b.xmin) * std::max(0.0, b.ymax - b.ymin);
}

// Intersection over union; 0 when the union is empty (two degenerate boxes).
inline double IoU(const Corners& a, const Corners& b) {
  const double iw = std::min(a.xmax, b.xmax) - std::max(a.xmin, b.xmin);
  const double ih = std::min(a.ymax, b.ymax) - std::max(a.ymin, b.ymin);
  if (iw <= 0 || ih <= 0) return 0.0;
  const double inter = iw * ih;
  const double uni = Area(a) + Area(b) - inter;
  return uni > 0 ? inter / uni : 0.0;
}

using Variance = std::array<double, 4>;
inline constexpr Variance kSsdVariance = {0.1, 0.1, 0.2, 0.2};
// torchvision's cap on the decoded size terms: log(1000 / 16).
inline const double kMaxSizeTerm = std::log(1000.0 / 16);

inline std::array<double, 4> Encode(const CenterSize& g, const CenterSize& p, const Variance& v) {
  return {(g.cx - p.cx) / p.w / v[0], (g.cy - p.cy) / p.h / v[1], std::log(g.w / p.w) / v[2],
          std::log(g.h / p.h) / v[3]};
}

inline Corners Decode(const double t[4], const CenterSize& p, const Variance& v) {
  const double cx = t[0] * v[0] * p.w + p.cx;
  const double cy = t[1] * v[1] * p.h + p.cy;
  const double w = std::exp(std::min(t[2] * v[2], kMaxSizeTerm)) * p.w;
  const double h = std::exp(std::min(t[3] * v[3], kMaxSizeTerm)) * p.h;
  return {cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h};
}

// The elements of a float tensor (f32, f64, bf16 or f16) as f64.
inline std::vector<double> ToDoubles(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.numel() == 0) return out;
  if (t.dtype() == DType::kF64) {
    std::copy(t.data<double>(), t.data<double>() + t.numel(), out.begin());
  } else {
    Tensor wide(t.shape(), DType::kF64);
    wide.ConvertFrom(t);
    std::copy(wide.data<double>(), wide.data<double>() + t.numel(), out.begin());
  }
  return out;
}

// Priors (P, 4) as (cx, cy, w, h); throws naming the layer unless the shape is (P, 4) with
// P == expected and every size positive.
inline std::vector<CenterSize> ReadPriors(const Layer& layer, const Blob& blob, int64_t expected) {
  const Tensor& t = blob.data;
  if (t.ndim() != 2 || t.dim(1) != 4 || t.dim(0) != expected) {
    Fail(layer.Describe(), ": priors '", blob.name, "' must be (", expected,
         ", 4) (cx, cy, w, h) to match the predictions, got ", t.ToString());
  }
  const std::vector<double> v = ToDoubles(t);
  std::vector<CenterSize> priors(static_cast<size_t>(expected));
  for (size_t p = 0; p < priors.size(); ++p) {
    priors[p] = {v[4 * p], v[4 * p + 1], v[4 * p + 2], v[4 * p + 3]};
    if (!(priors[p].w > 0 && priors[p].h > 0)) {
      Fail(layer.Describe(), ": prior ", p, " of '", blob.name, "' has width ", priors[p].w,
           " and height ", priors[p].h, "; both must be positive");
    }
  }
  return priors;
}

// Per-prior variances: the optional input (P, 4), else `setting` for every prior.
inline std::vector<Variance> ReadVariances(const Layer& layer, const Blob* blob, int64_t priors,
                                           const Variance& setting) {
  std::vector<Variance> out(static_cast<size_t>(priors), setting);
  if (blob == nullptr) return out;
  const Tensor& t = blob->data;
  if (t.ndim() != 2 || t.dim(0) != priors || t.dim(1) != 4) {
    Fail(layer.Describe(), ": variances '", blob->name, "' must be (", priors, ", 4), got ",
         t.ToString());
  }
  const std::vector<double> v = ToDoubles(t);
  for (size_t p = 0; p < out.size(); ++p) {
    for (size_t k = 0; k < 4; ++k) {
      out[p][k] = v[4 * p + k];
      if (!(out[p][k] > 0)) {
        Fail(layer.Describe(), ": variance ", k, " of prior ", p, " in '", blob->name, "' is ",
             out[p][k], "; variances must be positive");
      }
    }
  }
  return out;
}

// The `variance` setting: four positive numbers (default SSD's 0.1, 0.1, 0.2, 0.2).
inline Variance VarianceSetting(const Layer& layer, const Settings& settings) {
  const std::vector<double> v = settings.GetFloats(
      "variance", {kSsdVariance[0], kSsdVariance[1], kSsdVariance[2], kSsdVariance[3]});
  if (v.size() != 4 || !(v[0] > 0 && v[1] > 0 && v[2] > 0 && v[3] > 0)) {
    Fail(layer.Describe(), ": key 'variance' must be four positive numbers, got ", v.size(),
         " value(s)");
  }
  return {v[0], v[1], v[2], v[3]};
}

// The heads' two outputs, as both SSD layers take them: cls_logits (N, P, C) with C >= 2 (the
// background and at least one class) and bbox_regression (N, P, 4), floating and of one dtype.
inline void CheckHeadOutputs(const Layer& layer, const std::vector<Blob*>& bottom) {
  const Tensor& logits = bottom[0]->data;
  const Tensor& loc = bottom[1]->data;
  CheckFloatInput(layer, logits, "cls_logits (input 0)");
  CheckSameDType(layer, {bottom[0], bottom[1]});
  if (logits.ndim() != 3 || logits.dim(2) < 2) {
    Fail(layer.Describe(), ": cls_logits '", bottom[0]->name,
         "' must be (N, P, C) with C >= 2 (the background and at least one class), got ",
         logits.ToString());
  }
  if (loc.ndim() != 3 || loc.dim(0) != logits.dim(0) || loc.dim(1) != logits.dim(1) ||
      loc.dim(2) != 4) {
    Fail(layer.Describe(), ": bbox_regression '", bottom[1]->name, "' must be (", logits.dim(0),
         ", ", logits.dim(1), ", 4) to match cls_logits ", logits.ToString(), ", got ",
         loc.ToString());
  }
}

struct GroundTruth {
  int64_t item = 0;  // the image's position in the batch
  int label = 0;     // 1-based class
  Corners box;
  bool difficult = false;
};

// The ground-truth rows of `blob` ((1, 1, G, 8)), rows with item_id < 0 skipped. Throws naming
// the layer and the row for an item outside [0, items), a label outside [1, classes), a box with
// xmax < xmin or ymax < ymin, or a non-finite value.
inline std::vector<GroundTruth> ReadGroundTruth(const Layer& layer, const Blob& blob, int64_t items,
                                                int64_t classes) {
  const Tensor& t = blob.data;
  if (t.ndim() != 4 || t.dim(0) != 1 || t.dim(1) != 1 || t.dim(3) != 8) {
    Fail(layer.Describe(), ": ground truth '", blob.name,
         "' must be (1, 1, G, 8) rows [item_id, class_label, instance_id, xmin, ymin, xmax, "
         "ymax, difficult], got ",
         t.ToString());
  }
  const std::vector<double> v = ToDoubles(t);
  std::vector<GroundTruth> out;
  for (int64_t r = 0; r < t.dim(2); ++r) {
    const double* row = v.data() + 8 * r;
    for (int k = 0; k < 8; ++k) {
      if (!std::isfinite(row[k])) {
        Fail(layer.Describe(), ": ground-truth row ", r, " of '", blob.name, "' has a non-finite ",
             "value in column ", k);
      }
    }
    if (row[0] < 0) continue;  // Caffe's row of -1s: no boxes
    GroundTruth g;
    g.item = static_cast<int64_t>(row[0]);
    g.label = static_cast<int>(row[1]);
    g.box = {row[3], row[4], row[5], row[6]};
    g.difficult = row[7] != 0;
    if (g.item != row[0] || g.item >= items) {
      Fail(layer.Describe(), ": ground-truth row ", r, " of '", blob.name, "' names item ", row[0],
           "; the batch has items 0 to ", items - 1);
    }
    if (g.label != row[1] || g.label < 1 || g.label >= classes) {
      Fail(layer.Describe(), ": ground-truth row ", r, " of '", blob.name, "' has class ", row[1],
           "; classes are 1 to ", classes - 1, " (0 is the background)");
    }
    if (g.box.xmax < g.box.xmin || g.box.ymax < g.box.ymin) {
      Fail(layer.Describe(), ": ground-truth row ", r, " of '", blob.name, "' has the box [",
           g.box.xmin, ", ", g.box.ymin, ", ", g.box.xmax, ", ", g.box.ymax,
           "], whose max corner lies before its min corner");
    }
    out.push_back(g);
  }
  return out;
}

}  // namespace cortado::box
