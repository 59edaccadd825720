#include "layers/detection_output.h"

#include <algorithm>
#include <cmath>

#include "engine/base/thread_pool.h"
#include "layers/layer_util.h"

namespace cortado {

void DetectionOutputLayer::LayerSetUp(const std::vector<Blob*>& bottom,
                                      const std::vector<Blob*>& top) {
  confidence_threshold_ = settings().GetFloat("confidence_threshold", 0.01);
  nms_threshold_ = settings().GetFloat("nms_threshold", 0.45);
  if (!(nms_threshold_ >= 0 && nms_threshold_ <= 1)) {
    Fail(Describe(), ": key 'nms_threshold' must be in [0, 1], got ", nms_threshold_);
  }
  top_k_ = settings().GetInt("top_k", 400);
  keep_top_k_ = settings().GetInt("keep_top_k", 200);
  if (top_k_ < 0 || keep_top_k_ < 0) {
    Fail(Describe(), ": keys 'top_k' and 'keep_top_k' must be >= 0 (0: no limit)");
  }
  clip_ = settings().GetBool("clip", true);
  variance_ = box::VarianceSetting(*this, settings());
}

void DetectionOutputLayer::Reshape(const std::vector<Blob*>& bottom,
                                   const std::vector<Blob*>& top) {
  const Tensor& logits = bottom[0]->data;
  box::CheckHeadOutputs(*this, bottom);
  num_ = logits.dim(0);
  priors_ = logits.dim(1);
  classes_ = logits.dim(2);
  // The most rows Forward can write (none in the train phase).
  int64_t rows = 0;
  if (phase() == Phase::kTest) {
    const int64_t per_class = top_k_ > 0 ? std::min(top_k_, priors_) : priors_;
    rows = per_class * (classes_ - 1);
    if (keep_top_k_ > 0) rows = std::min(rows, keep_top_k_);
    rows *= num_;
  }
  top[0]->data.Resize({1, 1, rows, 7}, MasterDType(logits.dtype()));
}

namespace {

struct Detection {
  double score;
  int label;
  int64_t prior;
};

// Higher score first; among equals the lower class, then the lower prior.
bool Better(const Detection& a, const Detection& b) {
  if (a.score != b.score) return a.score > b.score;
  if (a.label != b.label) return a.label < b.label;
  return a.prior < b.prior;
}

}  // namespace

template <typename S>
void DetectionOutputLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  using M = Compute<S>;  // the output's element type: f32, or f64 in an f64 net
  Tensor& out = top[0]->data;
  if (phase() != Phase::kTest) {
    out.Resize({1, 1, 0, 7});
    return;
  }
  const S* logits = bottom[0]->data.data<S>();  // (N, P, C)
  const S* loc = bottom[1]->data.data<S>();     // (N, P, 4)
  const int64_t p_n = priors_, c_n = classes_;
  const std::vector<box::CenterSize> priors = box::ReadPriors(*this, *bottom[2], p_n);
  const std::vector<box::Variance> variances =
      box::ReadVariances(*this, bottom.size() > 3 ? bottom[3] : nullptr, p_n, variance_);

  std::vector<std::vector<Detection>> kept(static_cast<size_t>(num_));
  std::vector<std::vector<box::Corners>> decoded(static_cast<size_t>(num_));
  ParallelFor(num_, 1, [&](int64_t i0, int64_t i1) {
    std::vector<double> scores(static_cast<size_t>(p_n * c_n));
    std::vector<Detection> candidates, survivors;
    for (int64_t i = i0; i < i1; ++i) {
      // Softmax scores and decoded boxes of every prior.
      for (int64_t p = 0; p < p_n; ++p) {
        const S* x = logits + (i * p_n + p) * c_n;
        double* s = scores.data() + p * c_n;
        double mx = Widen(x[0]);
        for (int64_t c = 1; c < c_n; ++c) mx = std::max(mx, static_cast<double>(Widen(x[c])));
        double sum = 0;
        for (int64_t c = 0; c < c_n; ++c) sum += s[c] = std::exp(Widen(x[c]) - mx);
        for (int64_t c = 0; c < c_n; ++c) s[c] /= sum;
      }
      std::vector<box::Corners>& boxes = decoded[static_cast<size_t>(i)];
      boxes.resize(static_cast<size_t>(p_n));
      for (int64_t p = 0; p < p_n; ++p) {
        const S* r = loc + (i * p_n + p) * 4;
        const double t[4] = {Widen(r[0]), Widen(r[1]), Widen(r[2]), Widen(r[3])};
        box::Corners b = box::Decode(t, priors[p], variances[p]);
        if (clip_) {
          b = {std::clamp(b.xmin, 0.0, 1.0), std::clamp(b.ymin, 0.0, 1.0),
               std::clamp(b.xmax, 0.0, 1.0), std::clamp(b.ymax, 0.0, 1.0)};
        }
        boxes[p] = b;
      }
      // Per class: threshold, top_k, greedy suppression.
      std::vector<Detection>& image = kept[static_cast<size_t>(i)];
      for (int c = 1; c < c_n; ++c) {
        candidates.clear();
        for (int64_t p = 0; p < p_n; ++p) {
          const double s = scores[p * c_n + c];
          if (s > confidence_threshold_) candidates.push_back({s, c, p});
        }
        if (top_k_ > 0 && static_cast<int64_t>(candidates.size()) > top_k_) {
          std::partial_sort(candidates.begin(), candidates.begin() + top_k_, candidates.end(),
                            Better);
          candidates.resize(static_cast<size_t>(top_k_));
        } else {
          std::sort(candidates.begin(), candidates.end(), Better);
        }
        survivors.clear();
        for (const Detection& d : candidates) {
          bool keep = true;
          for (const Detection& k : survivors) {
            if (box::IoU(boxes[d.prior], boxes[k.prior]) > nms_threshold_) {
              keep = false;
              break;
            }
          }
          if (keep) survivors.push_back(d);
        }
        image.insert(image.end(), survivors.begin(), survivors.end());
      }
      std::sort(image.begin(), image.end(), Better);
      if (keep_top_k_ > 0 && static_cast<int64_t>(image.size()) > keep_top_k_) {
        image.resize(static_cast<size_t>(keep_top_k_));
      }
    }
  });
  int64_t rows = 0;
  for (const auto& image : kept) rows += static_cast<int64_t>(image.size());
  CORTADO_ASSERT(rows <= out.dim(2));
  out.Resize({1, 1, rows, 7});  // within Reshape's size: the storage stays
  M* o = out.data<M>();
  for (int64_t i = 0; i < num_; ++i) {
    for (const Detection& d : kept[static_cast<size_t>(i)]) {
      const box::Corners& b = decoded[static_cast<size_t>(i)][static_cast<size_t>(d.prior)];
      const double row[7] = {static_cast<double>(i),
                             static_cast<double>(d.label),
                             d.score,
                             b.xmin,
                             b.ymin,
                             b.xmax,
                             b.ymax};
      for (double v : row) *o++ = static_cast<M>(v);
    }
  }
}

template <typename S>
void DetectionOutputLayer::BackwardT(const Blobs&, const std::vector<bool>&, const Blobs&) {}

template class TypedLayer<DetectionOutputLayer, AllFloatTypes>;

CORTADO_REGISTER_LAYER(DetectionOutput, DetectionOutputLayer);

}  // namespace cortado
