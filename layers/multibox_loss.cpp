#include "layers/multibox_loss.h"

#include <algorithm>
#include <cmath>

#include "engine/base/thread_pool.h"
#include "layers/layer_util.h"

namespace cortado {

void MultiBoxLossLayer::LayerSetUp(const std::vector<Blob*>& bottom,
                                   const std::vector<Blob*>& top) {
  overlap_threshold_ = settings().GetFloat("overlap_threshold", 0.5);
  if (!(overlap_threshold_ > 0 && overlap_threshold_ <= 1)) {
    Fail(Describe(), ": key 'overlap_threshold' must be in (0, 1], got ", overlap_threshold_);
  }
  neg_pos_ratio_ = settings().GetFloat("neg_pos_ratio", 3.0);
  if (!(neg_pos_ratio_ >= 0)) {
    Fail(Describe(), ": key 'neg_pos_ratio' must be >= 0, got ", neg_pos_ratio_);
  }
  loc_weight_ = settings().GetFloat("loc_weight", 1.0);
  if (!(loc_weight_ >= 0)) Fail(Describe(), ": key 'loc_weight' must be >= 0, got ", loc_weight_);
  variance_ = box::VarianceSetting(*this, settings());
  use_difficult_ = settings().GetBool("use_difficult_gt", true);
}

void MultiBoxLossLayer::Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) {
  const Tensor& logits = bottom[0]->data;
  box::CheckHeadOutputs(*this, bottom);
  num_ = logits.dim(0);
  priors_ = logits.dim(1);
  classes_ = logits.dim(2);
  top[0]->data.Resize({}, MasterDType(logits.dtype()));
}

namespace {

// Softmax cross-entropy of one row of logits against `label`: log(sum exp x) - x[label].
template <typename T>
double CrossEntropy(const T* x, int64_t classes, int label) {
  double mx = x[0];
  for (int64_t c = 1; c < classes; ++c) mx = std::max(mx, static_cast<double>(x[c]));
  double sum = 0;
  for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(x[c]) - mx);
  return mx + std::log(sum) - static_cast<double>(x[label]);
}

}  // namespace

template <typename T>
void MultiBoxLossLayer::ForwardT(const Blobs& bottom, const Blobs& top) {
  const T* logits = bottom[0]->data.data<T>();  // (N, P, C)
  const T* loc = bottom[1]->data.data<T>();     // (N, P, 4)
  const int64_t p_n = priors_, c_n = classes_;
  prior_boxes_ = box::ReadPriors(*this, *bottom[2], p_n);
  variances_ = box::ReadVariances(*this, bottom.size() > 4 ? bottom[4] : nullptr, p_n, variance_);
  gt_ = box::ReadGroundTruth(*this, *bottom[3], num_, c_n);
  if (!use_difficult_) std::erase_if(gt_, [](const box::GroundTruth& g) { return g.difficult; });
  std::vector<std::vector<int32_t>> by_item(static_cast<size_t>(num_));
  for (size_t g = 0; g < gt_.size(); ++g) {
    by_item[static_cast<size_t>(gt_[g].item)].push_back(static_cast<int32_t>(g));
  }
  std::vector<box::Corners> corners(prior_boxes_.size());
  for (size_t p = 0; p < corners.size(); ++p) corners[p] = box::ToCorners(prior_boxes_[p]);

  match_.assign(static_cast<size_t>(num_ * p_n), -1);
  target_.assign(static_cast<size_t>(num_ * p_n), -1);
  std::vector<double> loc_sum(static_cast<size_t>(num_), 0.0), conf_sum(loc_sum);
  std::vector<int64_t> positives(static_cast<size_t>(num_), 0);
  ParallelFor(num_, 1, [&](int64_t i0, int64_t i1) {
    std::vector<double> conf(static_cast<size_t>(p_n));
    std::vector<int32_t> negatives;
    for (int64_t i = i0; i < i1; ++i) {
      const std::vector<int32_t>& boxes = by_item[static_cast<size_t>(i)];
      if (boxes.empty()) continue;  // no positives, so no negatives are mined either
      int32_t* match = match_.data() + i * p_n;
      int32_t* target = target_.data() + i * p_n;
      // 1. Each prior's best box (at least the threshold); each box's best prior (first of
      //    equals), found in the same pass.
      std::vector<double> box_best(boxes.size(), -1.0);
      std::vector<int64_t> box_best_prior(boxes.size(), 0);
      for (int64_t p = 0; p < p_n; ++p) {
        double best = -1.0;
        int32_t best_box = -1;
        for (size_t b = 0; b < boxes.size(); ++b) {
          const double iou = box::IoU(gt_[static_cast<size_t>(boxes[b])].box, corners[p]);
          if (iou > best) best = iou, best_box = boxes[b];
          if (iou > box_best[b]) box_best[b] = iou, box_best_prior[b] = p;
        }
        if (best >= overlap_threshold_) match[p] = best_box;
      }
      for (size_t b = 0; b < boxes.size(); ++b) match[box_best_prior[b]] = boxes[b];

      // 2. Cross-entropy of every prior against its class target (0 when unmatched), the
      //    positives' losses, and the negatives to mine.
      negatives.clear();
      int64_t pos = 0;
      double loc_total = 0;
      for (int64_t p = 0; p < p_n; ++p) {
        const int label = match[p] >= 0 ? gt_[static_cast<size_t>(match[p])].label : 0;
        conf[p] = CrossEntropy(logits + (i * p_n + p) * c_n, c_n, label);
        if (match[p] < 0) {
          negatives.push_back(static_cast<int32_t>(p));
          continue;
        }
        ++pos;
        target[p] = label;
        const auto t = box::Encode(box::ToCenterSize(gt_[static_cast<size_t>(match[p])].box),
                                   prior_boxes_[p], variances_[p]);
        const T* r = loc + (i * p_n + p) * 4;
        for (int k = 0; k < 4; ++k) {
          const double d = std::fabs(static_cast<double>(r[k]) - t[k]);
          loc_total += d < 1.0 ? 0.5 * d * d : d - 0.5;
        }
      }
      // 3. Hard negatives: the largest cross-entropies, lower index first among equals.
      const int64_t want =
          static_cast<int64_t>(std::ceil(neg_pos_ratio_ * static_cast<double>(pos)));
      const int64_t keep = std::min<int64_t>(want, static_cast<int64_t>(negatives.size()));
      auto harder = [&](int32_t a, int32_t b) {
        return conf[a] > conf[b] || (conf[a] == conf[b] && a < b);
      };
      if (keep > 0 && keep < static_cast<int64_t>(negatives.size())) {
        std::nth_element(negatives.begin(), negatives.begin() + (keep - 1), negatives.end(),
                         harder);
      }
      for (int64_t j = 0; j < keep; ++j) target[negatives[static_cast<size_t>(j)]] = 0;
      double conf_total = 0;
      for (int64_t p = 0; p < p_n; ++p) {
        if (target[p] >= 0) conf_total += conf[p];
      }
      loc_sum[i] = loc_total;
      conf_sum[i] = conf_total;
      positives[i] = pos;
    }
  });
  double loc_all = 0, conf_all = 0;
  num_matched_ = 0;
  for (int64_t i = 0; i < num_; ++i) {
    loc_all += loc_sum[i];
    conf_all += conf_sum[i];
    num_matched_ += positives[i];
  }
  const double norm = static_cast<double>(std::max<int64_t>(1, num_matched_));
  top[0]->data.data<T>()[0] = static_cast<T>((loc_weight_ * loc_all + conf_all) / norm);
}

template <typename T>
void MultiBoxLossLayer::BackwardT(const Blobs& top, const std::vector<bool>& propagate_down,
                                  const Blobs& bottom) {
  const T* logits = bottom[0]->data.data<T>();  // (N, P, C)
  const T* loc = bottom[1]->data.data<T>();     // (N, P, 4)
  T* dlogits = propagate_down[0] ? bottom[0]->grad.data<T>() : nullptr;
  T* dloc = propagate_down[1] ? bottom[1]->grad.data<T>() : nullptr;
  const int64_t p_n = priors_, c_n = classes_;
  const double scale = static_cast<double>(top[0]->grad.data<T>()[0]) /
                       static_cast<double>(std::max<int64_t>(1, num_matched_));
  ParallelFor(num_ * p_n, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (dlogits != nullptr) {
        const T* x = logits + r * c_n;
        T* dx = dlogits + r * c_n;
        const int32_t label = target_[static_cast<size_t>(r)];
        if (label < 0) {
          std::fill(dx, dx + c_n, T(0));
        } else {
          double mx = x[0];
          for (int64_t c = 1; c < c_n; ++c) mx = std::max(mx, static_cast<double>(x[c]));
          double sum = 0;
          for (int64_t c = 0; c < c_n; ++c) sum += std::exp(static_cast<double>(x[c]) - mx);
          const double inv = scale / sum;
          for (int64_t c = 0; c < c_n; ++c) {
            const double prob_scaled = std::exp(static_cast<double>(x[c]) - mx) * inv;
            dx[c] = static_cast<T>(c == label ? prob_scaled - scale : prob_scaled);
          }
        }
      }
      if (dloc != nullptr) {
        T* d = dloc + r * 4;
        const int32_t g = match_[static_cast<size_t>(r)];
        if (g < 0) {
          std::fill(d, d + 4, T(0));
        } else {
          const int64_t p = r % p_n;
          const auto t = box::Encode(box::ToCenterSize(gt_[static_cast<size_t>(g)].box),
                                     prior_boxes_[p], variances_[p]);
          for (int k = 0; k < 4; ++k) {
            const double diff = static_cast<double>(loc[r * 4 + k]) - t[k];
            d[k] = static_cast<T>(std::clamp(diff, -1.0, 1.0) * loc_weight_ * scale);
          }
        }
      }
    }
  });
}

template class TypedLayer<MultiBoxLossLayer, WideFloatTypes>;

CORTADO_REGISTER_LAYER(MultiBoxLoss, MultiBoxLossLayer);

}  // namespace cortado
