#include "layers/prior_box.h"

#include <cmath>

#include "layers/box_util.h"
#include "layers/layer_util.h"

namespace cortado {

void PriorBoxLayer::LayerSetUp(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const std::string convention = settings().GetString("convention", "torchvision");
  if (convention != "torchvision" && convention != "caffe") {
    Fail(Describe(), ": key 'convention' expects torchvision or caffe, got '", convention, "'");
  }
  caffe_ = convention == "caffe";
  if (top.empty() || top.size() > 2) {
    Fail(Describe(), ": has 1 output (the priors) or 2 (the priors and their variances), got ",
         top.size());
  }
  const box::Variance v = box::VarianceSetting(*this, settings());
  variance_.assign(v.begin(), v.end());
  if (settings().Has("image_size")) image_size_ = settings().GetPair("image_size", 0);
  for (int64_t s : image_size_) {
    if (s <= 0) Fail(Describe(), ": key 'image_size' must be positive, got ", s);
  }
  maps_ = static_cast<int64_t>(bottom.size()) - (image_size_.empty() ? 1 : 0);
  if (maps_ < 1) {
    Fail(Describe(), ": needs at least one feature map and the image (or key 'image_size'), got ",
         bottom.size(), " input(s)");
  }
  auto per_map = [&](const char* key, const std::vector<double>& v, size_t want) {
    if (v.size() != want) {
      Fail(Describe(), ": key '", key, "' needs ", want, " value(s) for ", maps_,
           " feature map(s), got ", v.size());
    }
    for (double x : v) {
      if (!(x > 0)) Fail(Describe(), ": key '", key, "' must hold positive numbers, got ", x);
    }
  };

  // Aspect ratios: one list for every map, or the maps' lists concatenated with their counts.
  const std::vector<double> ratios = settings().GetFloats("aspect_ratios", {2.0});
  for (double r : ratios) {
    if (!(r > 0)) Fail(Describe(), ": key 'aspect_ratios' must hold positive numbers, got ", r);
  }
  std::vector<int64_t> counts = settings().GetInts("aspect_ratios_per_map", {});
  if (counts.empty()) {
    counts.assign(static_cast<size_t>(maps_), static_cast<int64_t>(ratios.size()));
    ratios_.assign(static_cast<size_t>(maps_), ratios);
  } else {
    int64_t total = 0;
    for (int64_t c : counts) {
      if (c < 0) Fail(Describe(), ": key 'aspect_ratios_per_map' must hold counts >= 0, got ", c);
      total += c;
    }
    if (static_cast<int64_t>(counts.size()) != maps_ ||
        total != static_cast<int64_t>(ratios.size())) {
      Fail(Describe(), ": key 'aspect_ratios_per_map' needs one count per feature map (", maps_,
           ") adding up to the ", ratios.size(), " aspect_ratios, got ", ShapeString(counts));
    }
    size_t at = 0;
    for (int64_t c : counts) {
      ratios_.emplace_back(ratios.begin() + at, ratios.begin() + at + c);
      at += static_cast<size_t>(c);
    }
  }
  steps_ = settings().GetFloats("steps", {});
  if (!steps_.empty()) per_map("steps", steps_, static_cast<size_t>(maps_));
  clip_ = settings().GetBool("clip", !caffe_);

  if (!caffe_) {
    if (settings().Has("scales")) {
      scales_ = settings().GetFloats("scales", {});
      per_map("scales", scales_, static_cast<size_t>(maps_ + 1));
    } else {
      // DefaultBoxGenerator: evenly spread from min_ratio to max_ratio, then 1.0.
      const double lo = settings().GetFloat("min_ratio", 0.15);
      const double hi = settings().GetFloat("max_ratio", 0.9);
      if (!(lo > 0 && hi > 0)) {
        Fail(Describe(), ": keys 'min_ratio' and 'max_ratio' must be positive");
      }
      if (maps_ > 1) {
        const double range = hi - lo;
        for (int64_t k = 0; k < maps_; ++k) {
          scales_.push_back(lo +
                            range * static_cast<double>(k) / (static_cast<double>(maps_) - 1.0));
        }
        scales_.push_back(1.0);
      } else {
        scales_ = {lo, hi};
      }
    }
  } else {
    if (!settings().Has("min_sizes")) {
      Fail(Describe(),
           ": key 'min_sizes' (pixels, one per feature map) is required with "
           "convention: caffe");
    }
    min_sizes_ = settings().GetFloats("min_sizes", {});
    per_map("min_sizes", min_sizes_, static_cast<size_t>(maps_));
    max_sizes_ = settings().GetFloats("max_sizes", {});
    if (!max_sizes_.empty()) per_map("max_sizes", max_sizes_, static_cast<size_t>(maps_));
    offset_ = settings().GetFloat("offset", 0.5);
    flip_ = settings().GetBool("flip", true);
    // Caffe's list: 1 first, each new ratio (and its inverse with flip) once; 1 itself adds no
    // box beyond the min_size one.
    for (std::vector<double>& list : ratios_) {
      std::vector<double> expanded = {1.0};
      for (double r : list) {
        bool known = false;
        for (double e : expanded) known = known || std::fabs(r - e) < 1e-6;
        if (known) continue;
        expanded.push_back(r);
        if (flip_) expanded.push_back(1.0 / r);
      }
      list.assign(expanded.begin() + 1, expanded.end());
    }
  }
}

std::vector<int64_t> PriorBoxLayer::BoxesPerPosition() const {
  std::vector<int64_t> out;
  for (const std::vector<double>& r : ratios_) {
    const int64_t n = static_cast<int64_t>(r.size());
    out.push_back(caffe_ ? 1 + (max_sizes_.empty() ? 0 : 1) + n : 2 + 2 * n);
  }
  return out;
}

std::vector<double> PriorBoxLayer::Generate(const std::vector<std::pair<int64_t, int64_t>>& maps,
                                            double image_h, double image_w,
                                            bool f32_rounding) const {
  // torchvision computes in f32 what its f64 Python floats give it: each such value is rounded
  // to f32 once (f32 division of f32 operands is the rounded exact quotient, which the f64
  // quotient rounded to f32 equals).
  auto round = [&](double v) {
    return f32_rounding ? static_cast<double>(static_cast<float>(v)) : v;
  };
  std::vector<double> out;
  for (size_t k = 0; k < maps.size(); ++k) {
    const auto [fh, fw] = maps[k];
    // (w, h) of each box at a position, normalized.
    std::vector<std::pair<double, double>> wh;
    if (!caffe_) {
      const double s = scales_[k], s_next = std::sqrt(scales_[k] * scales_[k + 1]);
      wh = {{s, s}, {s_next, s_next}};
      for (double a : ratios_[k]) {
        const double sq = std::sqrt(a);
        wh.push_back({s * sq, s / sq});
        wh.push_back({s / sq, s * sq});
      }
      for (auto& [w, h] : wh) {
        w = round(w);
        h = round(h);
        if (clip_) w = std::clamp(w, 0.0, 1.0), h = std::clamp(h, 0.0, 1.0);
      }
    } else {
      const double m = min_sizes_[k];
      wh = {{m, m}};
      if (!max_sizes_.empty()) {
        const double mm = std::sqrt(m * max_sizes_[k]);
        wh.push_back({mm, mm});
      }
      for (double a : ratios_[k]) wh.push_back({m * std::sqrt(a), m / std::sqrt(a)});
      for (auto& [w, h] : wh) w /= image_w, h /= image_h;
    }
    for (int64_t y = 0; y < fh; ++y) {
      for (int64_t x = 0; x < fw; ++x) {
        double cx, cy;
        if (!caffe_) {
          // (j + 0.5) / (image / step), or / grid size without steps.
          const double fx = steps_.empty() ? static_cast<double>(fw) : round(image_w / steps_[k]);
          const double fy = steps_.empty() ? static_cast<double>(fh) : round(image_h / steps_[k]);
          cx = round((static_cast<double>(x) + 0.5) / fx);
          cy = round((static_cast<double>(y) + 0.5) / fy);
        } else {
          const double step_w = steps_.empty() ? image_w / static_cast<double>(fw) : steps_[k];
          const double step_h = steps_.empty() ? image_h / static_cast<double>(fh) : steps_[k];
          cx = (static_cast<double>(x) + offset_) * step_w / image_w;
          cy = (static_cast<double>(y) + offset_) * step_h / image_h;
        }
        for (const auto& [w, h] : wh) {
          if (caffe_ && clip_) {
            // Caffe clips the corners.
            const double x0 = std::clamp(cx - 0.5 * w, 0.0, 1.0);
            const double y0 = std::clamp(cy - 0.5 * h, 0.0, 1.0);
            const double x1 = std::clamp(cx + 0.5 * w, 0.0, 1.0);
            const double y1 = std::clamp(cy + 0.5 * h, 0.0, 1.0);
            out.insert(out.end(), {0.5 * (x0 + x1), 0.5 * (y0 + y1), x1 - x0, y1 - y0});
          } else {
            out.insert(out.end(), {cx, cy, w, h});
          }
        }
      }
    }
  }
  return out;
}

void PriorBoxLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  std::vector<std::pair<int64_t, int64_t>> maps;
  for (int64_t k = 0; k < maps_; ++k) {
    const Tensor& f = bottom[static_cast<size_t>(k)]->data;
    if (f.ndim() != 4) {
      Fail(Describe(), ": feature map ", k, " ('", bottom[static_cast<size_t>(k)]->name,
           "') must be (N, C, H, W), got ", f.ToString());
    }
    maps.push_back({f.dim(2), f.dim(3)});
  }
  double image_h = 0, image_w = 0;
  if (!image_size_.empty()) {
    image_h = static_cast<double>(image_size_[0]);
    image_w = static_cast<double>(image_size_[1]);
  } else {
    const Blob* image = bottom.back();
    if (image->data.ndim() != 4) {
      Fail(Describe(), ": the image (last input, '", image->name, "') must be (N, C, H, W), got ",
           image->data.ToString(), " (or set key 'image_size' and give feature maps only)");
    }
    image_h = static_cast<double>(image->data.dim(2));
    image_w = static_cast<double>(image->data.dim(3));
  }
  const DType dtype = MasterDType(bottom[0]->data.dtype());
  std::vector<int64_t> key = {static_cast<int64_t>(image_h), static_cast<int64_t>(image_w),
                              static_cast<int64_t>(dtype)};
  for (const auto& [h, w] : maps) key.insert(key.end(), {h, w});
  if (key != made_for_) {
    priors_ = Generate(maps, image_h, image_w, dtype != DType::kF64);
    made_for_ = key;
  }
  top[0]->data.Resize({static_cast<int64_t>(priors_.size() / 4), 4}, dtype);
  if (top.size() > 1) top[1]->data.Resize({static_cast<int64_t>(priors_.size() / 4), 4}, dtype);
}

template <typename S>
void PriorBoxLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  using M = Compute<S>;             // f32 for f32, bf16 and f16 nets; f64 for f64
  M* out = top[0]->data.data<M>();  // (P, 4)
  for (size_t i = 0; i < priors_.size(); ++i) out[i] = static_cast<M>(priors_[i]);
  if (top.size() > 1) {
    M* var = top[1]->data.data<M>();  // (P, 4)
    for (size_t i = 0; i < priors_.size(); ++i) var[i] = static_cast<M>(variance_[i % 4]);
  }
}

template <typename S>
void PriorBoxLayer::BackwardT(const Blobs&, const std::vector<bool>&, const Blobs&) {}

template class TypedLayer<PriorBoxLayer, AllFloatTypes>;

CORTADO_REGISTER_LAYER(PriorBox, PriorBoxLayer);

}  // namespace cortado
