// Detection metrics as pure functions of detections and ground truth: Pascal VOC's AP at IoU 0.5
// (the VOC2007 11-point average and the VOC2010+ area under the curve, boxes marked difficult
// ignored as the devkit ignores them) and COCO's AP over IoU 0.50:0.05:0.95 (101 recall points,
// at most max_dets detections per image and class, optional small/medium/large area ranges),
// per class and averaged over classes. Nothing here knows a net: the eval tool feeds it the rows
// of DetectionOutput's (1, 1, D, 7) tensor and the loader's (1, 1, G, 8) ground truth.
//
// Accumulation: matching a detection to ground truth is a question about one image, so Add
// decides every detection's outcome (per threshold) when its batch arrives and keeps only
// (score, image, outcome) per detection and the ground-truth counts per class. The curves need
// all of them sorted by score, which Compute does. Accumulators merge (Merge, or Pack ->
// all-gather -> Unpack -> Merge) by concatenation and sums, and the order of equal scores is
// fixed by (image index, position in the image), so W ranks that evaluate disjoint images get
// exactly what one process gets, whatever order they merge in.
//
// Definitions (tests/tools/detection_eval_reference.py implements them independently):
//   VOC (devkit's voc_eval): per class, detections by descending score; each takes the box of
//     its class in its image it overlaps most; IoU > 0.5 with a box not yet taken is a true
//     positive, with a taken one (or IoU <= 0.5) a false positive, with a difficult box neither.
//     recall = TP / (boxes not difficult), precision = TP / (TP + FP). 11-point: the mean over
//     r = 0, 0.1, ..., 1 of the largest precision at recall >= r; area: the area under the
//     precision envelope. Coordinates are normalized, so IoU has no devkit "+1".
//   COCO (cocoeval.py's evaluateImg and accumulate): per image and class the max_dets best
//     detections, each matched greedily to the untaken box of best IoU >= t (boxes outside the
//     area range or difficult are "ignore" boxes, tried last; a difficult box is COCO's crowd:
//     IoU is intersection over the detection's area and it may take any number); detections on
//     ignore boxes, and unmatched ones outside the area range, count neither way. Precision is
//     made non-increasing, read at recall 0, 0.01, ..., 1 (0 past the last recall), averaged.
//     Areas are in pixels of the image's width x height (ImageInfo), boxes' w x h. A box whose
//     max corner lies before its min corner is refused (Add throws naming it).
// A class without a box that counts (all difficult, or none) has no AP (NaN) and is left out
// of the means.
// Threads: none; an accumulator is used from one thread.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace cortado::detection {

struct Box {
  double xmin = 0, ymin = 0, xmax = 0, ymax = 0;
};

// A row of DetectionOutput: [item_id, class_label, score, xmin, ymin, xmax, ymax].
struct Detection {
  int64_t item = 0;
  int label = 0;  // 1 .. K
  double score = 0;
  Box box;
};

// A row of the batch's ground truth: [item_id, class_label, instance_id, xmin, ymin, xmax, ymax,
// difficult].
struct GroundTruth {
  int64_t item = 0;
  int label = 0;  // 1 .. K
  Box box;
  bool difficult = false;
};

// One image of a batch (item i of the batch is images[i]).
struct ImageInfo {
  int64_t index = 0;  // its position in the evaluated set: orders equal scores, across ranks too
  int64_t id = 0;     // COCO's image id, for results files
  double width = 0, height = 0;  // the original image in pixels; 0: unknown (no area ranges)
};

// The rows of (1, 1, D, 7) detections and (1, 1, G, 8) ground truth given as `rows` x 7 (x 8)
// floats; rows with item_id < 0 (Caffe's "none" row) are skipped. Throws naming the row for a
// class outside 1 .. num_classes or an item outside 0 .. items - 1.
std::vector<Detection> ParseDetections(const float* data, int64_t rows, int num_classes,
                                       int64_t items);
std::vector<GroundTruth> ParseGroundTruth(const float* data, int64_t rows, int num_classes,
                                          int64_t items);

inline constexpr int kIouThresholds = 10;  // COCO's 0.50, 0.55, ..., 0.95
inline constexpr int kAreaRanges = 4;      // all, small (< 32^2), medium (< 96^2), large

struct DetectionMetrics {
  int num_classes = 0;
  // Per class (entry c - 1 for class c); NaN where the class has no box that counts.
  std::vector<double> voc07_ap, voc_ap;  // VOC AP@0.5: 11-point, area under the curve
  std::vector<double> coco_ap;           // AP@[.5:.95], all areas
  std::vector<double> coco_ap50, coco_ap75;
  std::vector<int64_t> positives;   // boxes that are not difficult
  std::vector<int64_t> detections;  // detections of the class
  // Means over the classes that have an AP.
  double voc07_map = 0, voc_map = 0;
  double coco_map = 0, coco_map50 = 0, coco_map75 = 0;
  // COCO's mAP in the small, medium and large ranges; NaN when some image had no size.
  std::array<double, 3> coco_map_area = {0, 0, 0};
  int64_t images = 0;
};

class DetectionAccumulator {
 public:
  // Labels 1 .. num_classes; COCO keeps an image's max_dets best detections per class.
  explicit DetectionAccumulator(int num_classes, int max_dets = 100);

  // One batch: items 0 .. images.size() - 1 with their detections and boxes (any order).
  void Add(std::span<const Detection> detections, std::span<const GroundTruth> boxes,
           std::span<const ImageInfo> images);
  // Adds another accumulator's images (of the same num_classes and max_dets).
  void Merge(const DetectionAccumulator& other);
  // The state as doubles (exact: integers below 2^53, scores as they are), for an all-gather;
  // Unpack(Pack()) equals the accumulator.
  std::vector<double> Pack() const;
  static DetectionAccumulator Unpack(std::span<const double> packed);

  DetectionMetrics Compute() const;
  int num_classes() const { return num_classes_; }
  int64_t images() const { return images_; }

 private:
  // One detection's outcome: VOC's, and COCO's per area range as bit t per IoU threshold.
  struct Record {
    double score = 0;
    int64_t image = 0;  // ImageInfo::index
    int64_t order = 0;  // position among its image's detections of its class, by score
    int label = 0;
    uint8_t voc = 0;                             // kFalse, kTrue or kIgnored
    std::array<uint16_t, kAreaRanges> tp{};      // matched at threshold t
    std::array<uint16_t, kAreaRanges> ignore{};  // counts neither way at threshold t
  };
  std::vector<Record> SortedRecords(int label) const;

  int num_classes_ = 0;
  int max_dets_ = 100;
  bool sizes_known_ = true;
  int64_t images_ = 0;
  std::vector<Record> records_;
  std::vector<int64_t> voc_positives_;                            // per class
  std::vector<std::array<int64_t, kAreaRanges>> coco_positives_;  // per class and area range
};

// A summary for logs and --json: map50 is VOC's mAP@0.5 (11-point when voc07, else area under
// the curve), map COCO's mAP@[.5:.95]; per-class entries under "classes" by name (names[c - 1],
// or the number).
nlohmann::ordered_json MetricsJson(const DetectionMetrics& metrics, bool voc07,
                                   const std::vector<std::string>& names = {});

// Detections in COCO's results format, [{"image_id", "category_id", "bbox": [x, y, w, h] in
// pixels, "score"}], the file pycocotools' loadRes and the COCO evaluation server read.
class CocoResults {
 public:
  // category_ids[c - 1] is class c's COCO category id (empty: the class number itself).
  explicit CocoResults(std::vector<int64_t> category_ids = {});
  // Every image needs its width and height (the boxes are normalized).
  void Add(std::span<const Detection> detections, std::span<const ImageInfo> images);
  size_t size() const { return entries_.size(); }
  std::string Json() const;
  // Replaces `path` atomically.
  void Write(const std::string& path) const;

 private:
  std::vector<int64_t> category_ids_;
  nlohmann::json entries_ = nlohmann::json::array();
};

}  // namespace cortado::detection
