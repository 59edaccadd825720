#include "tools/detection_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

#include "engine/base/error.h"

namespace cortado::detection {
namespace {

constexpr uint8_t kFalse = 0, kTrue = 1, kIgnored = 2;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// COCO's area ranges in pixels^2: all, small, medium, large (bounds inclusive, as cocoeval).
constexpr double kAreaBounds[kAreaRanges][2] = {
    {0, 1e10}, {0, 32.0 * 32.0}, {32.0 * 32.0, 96.0 * 96.0}, {96.0 * 96.0, 1e10}};

// np.linspace(.5, .95, 10) and np.linspace(0, 1, 101): start + i * step, the last one exact.
double IouThreshold(int t) {
  return t == kIouThresholds - 1 ? 0.95 : 0.5 + t * ((0.95 - 0.5) / (kIouThresholds - 1));
}
double RecallPoint(int r) { return r == 100 ? 1.0 : r * (1.0 / 100); }

double Area(const Box& b) {
  return std::max(0.0, b.xmax - b.xmin) * std::max(0.0, b.ymax - b.ymin);
}

double Intersection(const Box& a, const Box& b) {
  const double w = std::min(a.xmax, b.xmax) - std::max(a.xmin, b.xmin);
  const double h = std::min(a.ymax, b.ymax) - std::max(a.ymin, b.ymin);
  return w > 0 && h > 0 ? w * h : 0.0;
}

double IoU(const Box& a, const Box& b) {
  const double inter = Intersection(a, b);
  const double uni = Area(a) + Area(b) - inter;
  return uni > 0 ? inter / uni : 0.0;
}

// COCO's IoU of detection d with box g: a crowd box (here: a difficult one) divides by the
// detection's area alone.
double CocoIoU(const Box& d, const Box& g, bool crowd) {
  const double inter = Intersection(d, g);
  const double uni = crowd ? Area(d) : Area(d) + Area(g) - inter;
  return uni > 0 ? inter / uni : 0.0;
}

Box RowBox(const float* r) { return {r[0], r[1], r[2], r[3]}; }

void CheckRow(const char* what, int64_t row, double item, double label, int num_classes,
              int64_t items) {
  if (item != std::floor(item) || item >= static_cast<double>(items)) {
    Fail(what, " row ", row, " names item ", item, "; the batch has items 0 to ", items - 1);
  }
  if (label != std::floor(label) || label < 1 || label > num_classes) {
    Fail(what, " row ", row, " has class ", label, "; classes are 1 to ", num_classes);
  }
}

// The VOC AP of one class from its detections' outcomes (by descending score) and its count
// of boxes that are not difficult: {11-point, area under the curve}.
std::pair<double, double> VocAp(const std::vector<uint8_t>& outcomes, int64_t positives) {
  if (positives == 0) return {kNaN, kNaN};
  const size_t n = outcomes.size();
  std::vector<double> rec(n), prec(n);
  double tp = 0, fp = 0;
  for (size_t i = 0; i < n; ++i) {
    tp += outcomes[i] == kTrue ? 1 : 0;
    fp += outcomes[i] == kFalse ? 1 : 0;
    rec[i] = tp / static_cast<double>(positives);
    prec[i] = tp / std::max(tp + fp, std::numeric_limits<double>::epsilon());
  }
  double ap07 = 0;
  for (int k = 0; k <= 10; ++k) {
    const double t = k * 0.1;  // np.arange(0., 1.1, 0.1)
    double p = 0;
    for (size_t i = 0; i < n; ++i) {
      if (rec[i] >= t) p = std::max(p, prec[i]);
    }
    ap07 += p / 11.0;
  }
  // Area under the precision envelope, over the points where recall changes.
  std::vector<double> mrec = {0.0}, mpre = {0.0};
  mrec.insert(mrec.end(), rec.begin(), rec.end());
  mpre.insert(mpre.end(), prec.begin(), prec.end());
  mrec.push_back(1.0);
  mpre.push_back(0.0);
  for (size_t i = mpre.size() - 1; i > 0; --i) mpre[i - 1] = std::max(mpre[i - 1], mpre[i]);
  double area = 0;
  for (size_t i = 0; i + 1 < mrec.size(); ++i) {
    if (mrec[i + 1] != mrec[i]) area += (mrec[i + 1] - mrec[i]) * mpre[i + 1];
  }
  return {ap07, area};
}

// COCO's precision averaged over the 101 recall points, from the outcomes (by descending
// score) at one threshold and area range: tp[i] matched, ignore[i] counted neither way.
double CocoAp(const std::vector<bool>& tp, const std::vector<bool>& ignore, int64_t positives) {
  const size_t n = tp.size();
  std::vector<double> rc(n), pr(n);
  double tps = 0, fps = 0;
  for (size_t i = 0; i < n; ++i) {
    tps += tp[i] && !ignore[i] ? 1 : 0;
    fps += !tp[i] && !ignore[i] ? 1 : 0;
    rc[i] = tps / static_cast<double>(positives);
    pr[i] = tps / (fps + tps + std::numeric_limits<double>::epsilon());  // np.spacing(1)
  }
  for (size_t i = n; i-- > 1;) pr[i - 1] = std::max(pr[i - 1], pr[i]);
  double sum = 0;
  for (int r = 0; r <= 100; ++r) {
    // np.searchsorted(rc, r, side='left'): the first recall >= r; 0 past the end.
    const size_t at =
        static_cast<size_t>(std::lower_bound(rc.begin(), rc.end(), RecallPoint(r)) - rc.begin());
    sum += at < n ? pr[at] : 0.0;
  }
  return sum / 101.0;
}

double MeanOfNumbers(const std::vector<double>& v) {
  double sum = 0;
  int64_t n = 0;
  for (double x : v) {
    if (!std::isnan(x)) sum += x, ++n;
  }
  return n > 0 ? sum / static_cast<double>(n) : kNaN;
}

}  // namespace

std::vector<Detection> ParseDetections(const float* data, int64_t rows, int num_classes,
                                       int64_t items) {
  std::vector<Detection> out;
  for (int64_t i = 0; i < rows; ++i) {
    const float* r = data + 7 * i;
    if (r[0] < 0) continue;
    CheckRow("detection", i, r[0], r[1], num_classes, items);
    out.push_back({static_cast<int64_t>(r[0]), static_cast<int>(r[1]), r[2], RowBox(r + 3)});
  }
  return out;
}

std::vector<GroundTruth> ParseGroundTruth(const float* data, int64_t rows, int num_classes,
                                          int64_t items) {
  std::vector<GroundTruth> out;
  for (int64_t i = 0; i < rows; ++i) {
    const float* r = data + 8 * i;
    if (r[0] < 0) continue;
    CheckRow("ground-truth", i, r[0], r[1], num_classes, items);
    out.push_back({static_cast<int64_t>(r[0]), static_cast<int>(r[1]), RowBox(r + 3), r[7] != 0});
  }
  return out;
}

DetectionAccumulator::DetectionAccumulator(int num_classes, int max_dets)
    : num_classes_(num_classes),
      max_dets_(max_dets),
      voc_positives_(static_cast<size_t>(std::max(num_classes, 0)), 0),
      coco_positives_(static_cast<size_t>(std::max(num_classes, 0))) {
  CORTADO_CHECK(num_classes >= 1, "detection metrics need at least one class, got ", num_classes);
  CORTADO_CHECK(max_dets >= 1, "detection metrics: max_dets must be at least 1, got ", max_dets);
  for (auto& c : coco_positives_) c.fill(0);
}

void DetectionAccumulator::Add(std::span<const Detection> detections,
                               std::span<const GroundTruth> boxes,
                               std::span<const ImageInfo> images) {
  const int64_t items = static_cast<int64_t>(images.size());
  for (const ImageInfo& im : images) {
    if (!(im.width > 0 && im.height > 0)) sizes_known_ = false;
  }
  // By image and class; detections in the order given (their position breaks score ties).
  const size_t cells = static_cast<size_t>(items * num_classes_);
  std::vector<std::vector<size_t>> dets(cells), gts(cells);
  auto cell = [&](int64_t item, int label, const char* what) {
    CORTADO_CHECK(item >= 0 && item < items && label >= 1 && label <= num_classes_, what,
                  " of item ", item, " class ", label, " is outside the batch's ", items,
                  " image(s) and classes 1 to ", num_classes_);
    return static_cast<size_t>(item * num_classes_ + label - 1);
  };
  // An inverted box has no area: COCO would call it negative, IoU would call it empty.
  auto check_box = [](const Box& b, const char* what, int64_t item, int label) {
    if (b.xmax < b.xmin || b.ymax < b.ymin) {
      Fail(what, " of item ", item, " (class ", label, ") has the box [", b.xmin, ", ", b.ymin,
           ", ", b.xmax, ", ", b.ymax, "], whose max corner lies before its min corner");
    }
  };
  for (size_t i = 0; i < detections.size(); ++i) {
    const Detection& d = detections[i];
    check_box(d.box, "a detection", d.item, d.label);
    dets[cell(d.item, d.label, "a detection")].push_back(i);
  }
  for (size_t i = 0; i < boxes.size(); ++i) {
    check_box(boxes[i].box, "a ground-truth box", boxes[i].item, boxes[i].label);
    gts[cell(boxes[i].item, boxes[i].label, "a ground-truth box")].push_back(i);
  }
  for (int64_t item = 0; item < items; ++item) {
    const ImageInfo& im = images[static_cast<size_t>(item)];
    const double pixels = sizes_known_ ? im.width * im.height : 0.0;
    for (int label = 1; label <= num_classes_; ++label) {
      const size_t at = static_cast<size_t>(item * num_classes_ + label - 1);
      std::vector<size_t> d = dets[at];
      const std::vector<size_t>& g = gts[at];
      // Descending score, the given order among equals (numpy's stable mergesort).
      std::stable_sort(d.begin(), d.end(), [&](size_t a, size_t b) {
        return detections[a].score > detections[b].score;
      });
      const size_t first = records_.size();
      for (size_t k = 0; k < d.size(); ++k) {
        Record r;
        r.score = detections[d[k]].score;
        r.image = im.index;
        r.order = static_cast<int64_t>(k);
        r.label = label;
        records_.push_back(r);
      }
      // VOC: each detection takes the box it overlaps most, taken or not.
      std::vector<bool> taken(g.size(), false);
      for (size_t k = 0; k < d.size(); ++k) {
        double best = -std::numeric_limits<double>::infinity();
        size_t j = 0;
        for (size_t b = 0; b < g.size(); ++b) {
          const double iou = IoU(detections[d[k]].box, boxes[g[b]].box);
          if (iou > best) best = iou, j = b;
        }
        uint8_t outcome = kFalse;
        if (best > 0.5) {
          if (boxes[g[j]].difficult) {
            outcome = kIgnored;
          } else if (!taken[j]) {
            outcome = kTrue;
            taken[j] = true;
          }
        }
        records_[first + k].voc = outcome;
      }
      int64_t voc_positives = 0;
      for (size_t b : g) voc_positives += boxes[b].difficult ? 0 : 1;
      voc_positives_[static_cast<size_t>(label - 1)] += voc_positives;

      // COCO, per area range: boxes ignored (difficult = crowd, or outside the range) last, the
      // max_dets best detections matched greedily per threshold.
      const size_t kept = std::min(d.size(), static_cast<size_t>(max_dets_));
      for (size_t k = kept; k < d.size(); ++k) {
        records_[first + k].ignore.fill((1u << kIouThresholds) - 1);  // beyond max_dets: absent
      }
      for (int a = 0; a < kAreaRanges; ++a) {
        const double lo = kAreaBounds[a][0], hi = kAreaBounds[a][1];
        auto outside = [&](const Box& b) {
          const double area = Area(b) * pixels;
          return area < lo || area > hi;
        };
        std::vector<size_t> order(g.size());
        std::iota(order.begin(), order.end(), 0);
        std::vector<bool> ignored(g.size());
        for (size_t b = 0; b < g.size(); ++b) {
          ignored[b] = boxes[g[b]].difficult || outside(boxes[g[b]].box);
        }
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t x, size_t y) { return !ignored[x] && ignored[y]; });
        int64_t counted = 0;
        for (size_t b = 0; b < g.size(); ++b) counted += ignored[b] ? 0 : 1;
        coco_positives_[static_cast<size_t>(label - 1)][static_cast<size_t>(a)] += counted;
        for (int t = 0; t < kIouThresholds; ++t) {
          std::vector<bool> matched(g.size(), false);
          for (size_t k = 0; k < kept; ++k) {
            const Box& db = detections[d[k]].box;
            double best = std::min(IouThreshold(t), 1 - 1e-10);
            int m = -1;  // index into `order`
            for (size_t o = 0; o < order.size(); ++o) {
              const size_t b = order[o];
              const bool crowd = boxes[g[b]].difficult;
              if (matched[b] && !crowd) continue;
              // Matched to a counted box already: the ignore boxes that follow cannot win.
              if (m > -1 && !ignored[order[static_cast<size_t>(m)]] && ignored[b]) break;
              const double iou = CocoIoU(db, boxes[g[b]].box, crowd);
              if (iou < best) continue;
              best = iou;
              m = static_cast<int>(o);
            }
            Record& r = records_[first + k];
            const uint16_t bit = static_cast<uint16_t>(1u << t);
            if (m >= 0) {
              const size_t b = order[static_cast<size_t>(m)];
              matched[b] = true;
              r.tp[a] |= bit;
              if (ignored[b]) r.ignore[a] |= bit;
            } else if (outside(db)) {
              r.ignore[a] |= bit;
            }
          }
        }
      }
    }
  }
  images_ += items;
}

void DetectionAccumulator::Merge(const DetectionAccumulator& other) {
  CORTADO_CHECK(other.num_classes_ == num_classes_ && other.max_dets_ == max_dets_,
                "detection metrics: cannot merge an accumulator of ", other.num_classes_,
                " classes (max_dets ", other.max_dets_, ") into one of ", num_classes_,
                " (max_dets ", max_dets_, ")");
  records_.insert(records_.end(), other.records_.begin(), other.records_.end());
  for (size_t c = 0; c < voc_positives_.size(); ++c) {
    voc_positives_[c] += other.voc_positives_[c];
    for (int a = 0; a < kAreaRanges; ++a) coco_positives_[c][a] += other.coco_positives_[c][a];
  }
  sizes_known_ = sizes_known_ && other.sizes_known_;
  images_ += other.images_;
}

namespace {
constexpr double kPackVersion = 1;
// 10 bits per area range, 4 ranges: 40 bits, exact in a double.
double PackBits(const std::array<uint16_t, kAreaRanges>& bits) {
  uint64_t v = 0;
  for (int a = 0; a < kAreaRanges; ++a) v |= static_cast<uint64_t>(bits[a]) << (10 * a);
  return static_cast<double>(v);
}
std::array<uint16_t, kAreaRanges> UnpackBits(double packed) {
  const uint64_t v = static_cast<uint64_t>(packed);
  std::array<uint16_t, kAreaRanges> bits{};
  for (int a = 0; a < kAreaRanges; ++a) bits[a] = static_cast<uint16_t>((v >> (10 * a)) & 1023u);
  return bits;
}
constexpr size_t kRecordDoubles = 7;
}  // namespace

std::vector<double> DetectionAccumulator::Pack() const {
  std::vector<double> out = {kPackVersion,
                             static_cast<double>(num_classes_),
                             static_cast<double>(max_dets_),
                             sizes_known_ ? 1.0 : 0.0,
                             static_cast<double>(images_),
                             static_cast<double>(records_.size())};
  for (size_t c = 0; c < voc_positives_.size(); ++c) {
    out.push_back(static_cast<double>(voc_positives_[c]));
    for (int a = 0; a < kAreaRanges; ++a) out.push_back(static_cast<double>(coco_positives_[c][a]));
  }
  for (const Record& r : records_) {
    out.insert(out.end(), {r.score, static_cast<double>(r.image), static_cast<double>(r.order),
                           static_cast<double>(r.label), static_cast<double>(r.voc), PackBits(r.tp),
                           PackBits(r.ignore)});
  }
  return out;
}

DetectionAccumulator DetectionAccumulator::Unpack(std::span<const double> packed) {
  CORTADO_CHECK(packed.size() >= 6 && packed[0] == kPackVersion,
                "detection metrics: not a packed accumulator (version ",
                packed.empty() ? 0.0 : packed[0], ")");
  DetectionAccumulator acc(static_cast<int>(packed[1]), static_cast<int>(packed[2]));
  acc.sizes_known_ = packed[3] != 0;
  acc.images_ = static_cast<int64_t>(packed[4]);
  const size_t records = static_cast<size_t>(packed[5]);
  const size_t classes = static_cast<size_t>(acc.num_classes_);
  const size_t want = 6 + classes * (1 + kAreaRanges) + records * kRecordDoubles;
  CORTADO_CHECK(packed.size() == want, "detection metrics: a packed accumulator of ", records,
                " detections needs ", want, " values, got ", packed.size());
  size_t at = 6;
  for (size_t c = 0; c < classes; ++c) {
    acc.voc_positives_[c] = static_cast<int64_t>(packed[at++]);
    for (int a = 0; a < kAreaRanges; ++a) {
      acc.coco_positives_[c][a] = static_cast<int64_t>(packed[at++]);
    }
  }
  acc.records_.resize(records);
  for (Record& r : acc.records_) {
    r.score = packed[at];
    r.image = static_cast<int64_t>(packed[at + 1]);
    r.order = static_cast<int64_t>(packed[at + 2]);
    r.label = static_cast<int>(packed[at + 3]);
    r.voc = static_cast<uint8_t>(packed[at + 4]);
    r.tp = UnpackBits(packed[at + 5]);
    r.ignore = UnpackBits(packed[at + 6]);
    at += kRecordDoubles;
  }
  return acc;
}

std::vector<DetectionAccumulator::Record> DetectionAccumulator::SortedRecords(int label) const {
  std::vector<Record> out;
  for (const Record& r : records_) {
    if (r.label == label) out.push_back(r);
  }
  // Descending score; equal scores in image order, then in their image's order: what one
  // process adding the images in order gets from a stable sort.
  std::sort(out.begin(), out.end(), [](const Record& a, const Record& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.image != b.image) return a.image < b.image;
    return a.order < b.order;
  });
  return out;
}

DetectionMetrics DetectionAccumulator::Compute() const {
  DetectionMetrics m;
  m.num_classes = num_classes_;
  m.images = images_;
  const size_t k_n = static_cast<size_t>(num_classes_);
  m.voc07_ap.assign(k_n, kNaN);
  m.voc_ap.assign(k_n, kNaN);
  m.coco_ap.assign(k_n, kNaN);
  m.coco_ap50.assign(k_n, kNaN);
  m.coco_ap75.assign(k_n, kNaN);
  m.positives = voc_positives_;
  m.detections.assign(k_n, 0);
  std::array<std::vector<double>, 3> area_ap;
  for (auto& v : area_ap) v.assign(k_n, kNaN);
  for (int label = 1; label <= num_classes_; ++label) {
    const size_t c = static_cast<size_t>(label - 1);
    const std::vector<Record> recs = SortedRecords(label);
    m.detections[c] = static_cast<int64_t>(recs.size());
    std::vector<uint8_t> outcomes;
    for (const Record& r : recs) outcomes.push_back(r.voc);
    std::tie(m.voc07_ap[c], m.voc_ap[c]) = VocAp(outcomes, voc_positives_[c]);
    for (int a = 0; a < kAreaRanges; ++a) {
      const int64_t positives = coco_positives_[c][a];
      if (positives == 0) continue;  // cocoeval's -1: left out of the means
      std::vector<double> per_threshold;
      for (int t = 0; t < kIouThresholds; ++t) {
        std::vector<bool> tp, ignore;
        for (const Record& r : recs) {
          tp.push_back((r.tp[a] >> t) & 1u);
          ignore.push_back((r.ignore[a] >> t) & 1u);
        }
        per_threshold.push_back(CocoAp(tp, ignore, positives));
      }
      const double mean = std::accumulate(per_threshold.begin(), per_threshold.end(), 0.0) /
                          static_cast<double>(kIouThresholds);
      if (a == 0) {
        m.coco_ap[c] = mean;
        m.coco_ap50[c] = per_threshold[0];
        m.coco_ap75[c] = per_threshold[5];
      } else {
        area_ap[static_cast<size_t>(a - 1)][c] = mean;
      }
    }
  }
  m.voc07_map = MeanOfNumbers(m.voc07_ap);
  m.voc_map = MeanOfNumbers(m.voc_ap);
  m.coco_map = MeanOfNumbers(m.coco_ap);
  m.coco_map50 = MeanOfNumbers(m.coco_ap50);
  m.coco_map75 = MeanOfNumbers(m.coco_ap75);
  for (size_t a = 0; a < 3; ++a) {
    m.coco_map_area[a] = sizes_known_ ? MeanOfNumbers(area_ap[a]) : kNaN;
  }
  return m;
}

}  // namespace cortado::detection
