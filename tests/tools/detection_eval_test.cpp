// Detection metrics (tools/detection_eval.h): hand-computed VOC and COCO cases, agreement with an
// independent Python implementation of the VOC devkit and COCOeval on random detections
// (tests/tools/detection_eval_reference.py; skipped where /usr/bin/python3 has no numpy),
// accumulators merged across "ranks" equal to one process, and COCO results files.
#include "tools/detection_eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/base/random.h"
#include "tests/support/errors.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"

namespace cortado::detection {
namespace {

using testing::ErrorOf;
using testing::TempDir;

std::vector<ImageInfo> Images(int64_t first, int64_t n, double w = 500, double h = 375) {
  std::vector<ImageInfo> out;
  for (int64_t i = 0; i < n; ++i) out.push_back({first + i, 1000 + first + i, w, h});
  return out;
}

// One class, two boxes, three detections: hit (0.9), miss (0.8), hit (0.7); a difficult box
// and a detection on it change nothing.
TEST(DetectionMetrics, VocByHand) {
  DetectionAccumulator acc(1);
  const std::vector<GroundTruth> boxes = {{0, 1, {0.1, 0.1, 0.3, 0.3}, false},
                                          {0, 1, {0.6, 0.6, 0.9, 0.9}, false},
                                          {0, 1, {0.4, 0.0, 0.5, 0.1}, true}};
  const std::vector<Detection> dets = {{0, 1, 0.9, {0.1, 0.1, 0.3, 0.31}},
                                       {0, 1, 0.8, {0.3, 0.6, 0.4, 0.7}},
                                       {0, 1, 0.7, {0.6, 0.6, 0.88, 0.9}},
                                       {0, 1, 0.75, {0.4, 0.0, 0.5, 0.1}}};
  acc.Add(dets, boxes, Images(0, 1));
  const DetectionMetrics m = acc.Compute();
  // recall 0.5, 0.5, 1 at precision 1, 0.5, 2/3.
  EXPECT_NEAR(m.voc_ap[0], 0.5 * 1 + 0.5 * 2.0 / 3, 1e-12);
  EXPECT_NEAR(m.voc07_ap[0], (6 * 1 + 5 * 2.0 / 3) / 11, 1e-12);
  EXPECT_EQ(m.positives[0], 2);
  EXPECT_EQ(m.detections[0], 4);
  EXPECT_NEAR(m.voc_map, m.voc_ap[0], 0);
}

// A second detection on a box already taken is a false positive, though its IoU is the best.
TEST(DetectionMetrics, VocSecondHitOnABoxIsFalse) {
  DetectionAccumulator acc(1);
  const std::vector<GroundTruth> boxes = {{0, 1, {0.1, 0.1, 0.5, 0.5}, false},
                                          {0, 1, {0.45, 0.1, 0.85, 0.5}, false}};
  // Both detections overlap box 0 most (the second also overlaps box 1, less).
  const std::vector<Detection> dets = {{0, 1, 0.9, {0.1, 0.1, 0.5, 0.5}},
                                       {0, 1, 0.8, {0.2, 0.1, 0.6, 0.5}}};
  acc.Add(dets, boxes, Images(0, 1));
  const DetectionMetrics m = acc.Compute();
  // recall 0.5, 0.5 at precision 1, 0.5: area 0.5, 11-point 6 / 11.
  EXPECT_NEAR(m.voc_ap[0], 0.5, 1e-12);
  EXPECT_NEAR(m.voc07_ap[0], 6.0 / 11, 1e-12);
}

// COCO: one box, one detection at IoU 0.72: a hit at thresholds 0.50 .. 0.70 (5 of 10), where
// precision is 1 at every recall point.
TEST(DetectionMetrics, CocoByHand) {
  DetectionAccumulator acc(2);
  // Box 0.5 x 0.5; the detection 0.5 x 0.36 inside it: IoU 0.72.
  const std::vector<GroundTruth> boxes = {{0, 2, {0.2, 0.2, 0.7, 0.7}, false}};
  const std::vector<Detection> dets = {{0, 2, 0.6, {0.2, 0.2, 0.7, 0.56}}};
  acc.Add(dets, boxes, Images(0, 1, 100, 100));
  const DetectionMetrics m = acc.Compute();
  EXPECT_TRUE(std::isnan(m.coco_ap[0]));  // class 1 has no box: no AP, left out of the mean
  EXPECT_NEAR(m.coco_ap[1], 0.5, 1e-12);
  EXPECT_NEAR(m.coco_map, 0.5, 1e-12);
  EXPECT_NEAR(m.coco_map50, 1.0, 1e-12);
  EXPECT_NEAR(m.coco_map75, 0.0, 1e-12);
  // 50 x 50 pixels = 2500: a medium box (32^2 .. 96^2).
  EXPECT_TRUE(std::isnan(m.coco_map_area[0]));
  EXPECT_NEAR(m.coco_map_area[1], 0.5, 1e-12);
  EXPECT_TRUE(std::isnan(m.coco_map_area[2]));
  // Without image sizes there are no area ranges.
  DetectionAccumulator unsized(2);
  unsized.Add(dets, boxes, Images(0, 1, 0, 0));
  const DetectionMetrics u = unsized.Compute();
  EXPECT_NEAR(u.coco_map, 0.5, 1e-12);
  EXPECT_TRUE(std::isnan(u.coco_map_area[1]));
}

// Random images, boxes, hits, near misses and stray detections, split into batches.
struct RandomSet {
  std::vector<ImageInfo> images;
  std::vector<std::vector<Detection>> dets;  // per image, item 0
  std::vector<std::vector<GroundTruth>> boxes;
};

RandomSet MakeRandomSet(int images, int classes, uint64_t seed, bool ties) {
  RandomSet s;
  Rng rng(seed);
  auto random_box = [&](double min_side, double max_side) {
    const double w = rng.Uniform(min_side, max_side), h = rng.Uniform(min_side, max_side);
    const double x = rng.Uniform(0, 1 - w), y = rng.Uniform(0, 1 - h);
    return Box{x, y, x + w, y + h};
  };
  // Values as the f32 rows of the tensors carry them.
  auto f32 = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  auto rounded = [&](Box b) { return Box{f32(b.xmin), f32(b.ymin), f32(b.xmax), f32(b.ymax)}; };
  auto score = [&]() { return ties ? std::round(rng.Uniform() * 20) / 20 : f32(rng.Uniform()); };
  for (int i = 0; i < images; ++i) {
    // Sizes from 64 to 640 pixels: boxes fall in all three COCO area ranges.
    s.images.push_back({i, 7 + 3 * i, 64.0 + 8 * (i % 73), 48.0 + 7 * (i % 83)});
    std::vector<GroundTruth> gts;
    std::vector<Detection> ds;
    const int n = static_cast<int>(rng.Below(6));
    for (int b = 0; b < n; ++b) {
      const int label = 1 + static_cast<int>(rng.Below(classes));
      const Box box = rounded(random_box(0.05, 0.6));
      gts.push_back({0, label, box, rng.Uniform() < 0.15});
      // Hits of varying quality, sometimes two on one box, sometimes the wrong class.
      const int hits = static_cast<int>(rng.Below(3));
      for (int h = 0; h < hits; ++h) {
        const double jitter = rng.Uniform(0, 0.25) * (box.xmax - box.xmin);
        // Corners moved by up to the jitter (put back in order: a box is never inverted).
        const double x0 = box.xmin + rng.Uniform(-1, 1) * jitter;
        const double y0 = box.ymin + rng.Uniform(-1, 1) * jitter;
        const double x1 = box.xmax + rng.Uniform(-1, 1) * jitter;
        const double y1 = box.ymax + rng.Uniform(-1, 1) * jitter;
        const Box d =
            rounded({std::min(x0, x1), std::min(y0, y1), std::max(x0, x1), std::max(y0, y1)});
        const int l = rng.Uniform() < 0.1 ? 1 + static_cast<int>(rng.Below(classes)) : label;
        ds.push_back({0, l, score(), d});
      }
    }
    const int strays = static_cast<int>(rng.Below(4));
    for (int k = 0; k < strays; ++k) {
      ds.push_back(
          {0, 1 + static_cast<int>(rng.Below(classes)), score(), rounded(random_box(0.02, 0.5))});
    }
    s.boxes.push_back(gts);
    s.dets.push_back(ds);
  }
  return s;
}

// Adds images [begin, end) of the set with a stride (rank r of W: r, r + W, ...), in batches.
void AddImages(DetectionAccumulator& acc, const RandomSet& s, int first, int stride, int batch) {
  std::vector<Detection> dets;
  std::vector<GroundTruth> boxes;
  std::vector<ImageInfo> images;
  auto flush = [&] {
    acc.Add(dets, boxes, images);
    dets.clear(), boxes.clear(), images.clear();
  };
  for (size_t i = static_cast<size_t>(first); i < s.images.size();
       i += static_cast<size_t>(stride)) {
    const int64_t item = static_cast<int64_t>(images.size());
    images.push_back(s.images[i]);
    for (Detection d : s.dets[i]) dets.push_back({item, d.label, d.score, d.box});
    for (GroundTruth g : s.boxes[i]) boxes.push_back({item, g.label, g.box, g.difficult});
    if (static_cast<int>(images.size()) == batch) flush();
  }
  if (!images.empty()) flush();
}

std::string ReferenceInput(const RandomSet& s, int classes, int max_dets) {
  nlohmann::json j;
  j["num_classes"] = classes;
  j["max_dets"] = max_dets;
  j["images"] = nlohmann::json::array();
  j["detections"] = nlohmann::json::array();
  j["boxes"] = nlohmann::json::array();
  for (size_t i = 0; i < s.images.size(); ++i) {
    const ImageInfo& im = s.images[i];
    j["images"].push_back({{"index", im.index}, {"width", im.width}, {"height", im.height}});
    for (const Detection& d : s.dets[i]) {
      j["detections"].push_back({{"image", im.index},
                                 {"label", d.label},
                                 {"score", d.score},
                                 {"box", {d.box.xmin, d.box.ymin, d.box.xmax, d.box.ymax}}});
    }
    for (const GroundTruth& g : s.boxes[i]) {
      j["boxes"].push_back({{"image", im.index},
                            {"label", g.label},
                            {"box", {g.box.xmin, g.box.ymin, g.box.xmax, g.box.ymax}},
                            {"difficult", g.difficult}});
    }
  }
  return j.dump();
}

void ExpectSameAp(const char* what, const std::vector<double>& ours, const nlohmann::json& theirs) {
  ASSERT_EQ(ours.size(), theirs.size()) << what;
  for (size_t c = 0; c < ours.size(); ++c) {
    if (theirs[c].is_null()) {
      EXPECT_TRUE(std::isnan(ours[c])) << what << " class " << c + 1 << ": " << ours[c];
    } else {
      EXPECT_NEAR(ours[c], theirs[c].get<double>(), 1e-12) << what << " class " << c + 1;
    }
  }
}

void ExpectSameMean(const char* what, double ours, const nlohmann::json& theirs) {
  if (theirs.is_null()) {
    EXPECT_TRUE(std::isnan(ours)) << what;
  } else {
    EXPECT_NEAR(ours, theirs.get<double>(), 1e-12) << what;
  }
}

class DetectionReference : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// 300 random images in batches of 8 against the Python reference: every class's VOC (both) and
// COCO (all, 0.5, 0.75, each area range) AP and their means. max_dets 100 leaves every
// detection in; 2 cuts many (COCO keeps an image's best 2 per class). Ties: scores in steps of
// 0.05, where the order of equal scores decides the curves.
TEST_P(DetectionReference, AgreesWithAnIndependentPythonImplementation) {
  const auto [max_dets, ties] = GetParam();
  const std::string python = "timeout 300 /usr/bin/python3";
  if (tooltest::RunShell(python + " -c 'import numpy'", nullptr, nullptr) != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no numpy for the reference implementation";
  }
  const int classes = 5;
  const RandomSet s = MakeRandomSet(300, classes, ties ? 77 : 78, ties);
  DetectionAccumulator acc(classes, max_dets);
  AddImages(acc, s, 0, 1, 8);
  const DetectionMetrics m = acc.Compute();
  TempDir dir;
  testing::WriteFile(dir / "in.json", ReferenceInput(s, classes, max_dets));
  std::string out, err;
  ASSERT_EQ(tooltest::RunShell(python + " " + CORTADO_SOURCE_DIR +
                                   "/tests/tools/detection_eval_reference.py " + (dir / "in.json") +
                                   " " + (dir / "out.json"),
                               &out, &err),
            0)
      << out << err;
  const nlohmann::json ref = nlohmann::json::parse(testing::ReadFileBytes(dir / "out.json"));
  ExpectSameAp("voc07", m.voc07_ap, ref["voc07"]);
  ExpectSameAp("voc", m.voc_ap, ref["voc"]);
  ExpectSameAp("coco", m.coco_ap, ref["coco"]);
  ExpectSameAp("coco50", m.coco_ap50, ref["coco50"]);
  ExpectSameAp("coco75", m.coco_ap75, ref["coco75"]);
  ExpectSameMean("map_voc07", m.voc07_map, ref["map_voc07"]);
  ExpectSameMean("map_voc", m.voc_map, ref["map_voc"]);
  ExpectSameMean("map_coco", m.coco_map, ref["map_coco"]);
  ExpectSameMean("map_coco50", m.coco_map50, ref["map_coco50"]);
  ExpectSameMean("map_coco75", m.coco_map75, ref["map_coco75"]);
  ExpectSameMean("map_small", m.coco_map_area[0], ref["map_small"]);
  ExpectSameMean("map_medium", m.coco_map_area[1], ref["map_medium"]);
  ExpectSameMean("map_large", m.coco_map_area[2], ref["map_large"]);
  // The set is not degenerate: APs strictly between 0 and 1, every area range populated.
  EXPECT_GT(m.voc_map, 0.2);
  EXPECT_LT(m.voc_map, 0.95);
  EXPECT_GT(m.coco_map, 0.05);
  for (double a : m.coco_map_area) EXPECT_FALSE(std::isnan(a));
}

INSTANTIATE_TEST_SUITE_P(Sets, DetectionReference,
                         ::testing::Values(std::tuple{100, false}, std::tuple{2, false},
                                           std::tuple{100, true}),
                         [](const auto& info) {
                           return "max_dets_" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_ties" : "");
                         });

bool SameMetrics(const DetectionMetrics& a, const DetectionMetrics& b) {
  auto same = [](double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; };
  auto same_v = [&](const std::vector<double>& x, const std::vector<double>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!same(x[i], y[i])) return false;
    }
    return true;
  };
  return same_v(a.voc07_ap, b.voc07_ap) && same_v(a.voc_ap, b.voc_ap) &&
         same_v(a.coco_ap, b.coco_ap) && same_v(a.coco_ap50, b.coco_ap50) &&
         same(a.coco_map_area[0], b.coco_map_area[0]) && a.positives == b.positives &&
         a.detections == b.detections && a.images == b.images;
}

// Three ranks evaluate interleaved shards (tied scores, so the order of equal scores matters),
// pack, and merge in any order: exactly one process's figures.
TEST(DetectionMetrics, RanksMergedInAnyOrderEqualOneProcess) {
  const RandomSet s = MakeRandomSet(120, 4, 5, /*ties=*/true);
  DetectionAccumulator one(4);
  AddImages(one, s, 0, 1, 6);
  const DetectionMetrics want = one.Compute();
  std::vector<std::vector<double>> packed;
  for (int r = 0; r < 3; ++r) {
    DetectionAccumulator rank(4);
    AddImages(rank, s, r, 3, 5);
    packed.push_back(rank.Pack());
  }
  for (const std::vector<int>& order : {std::vector<int>{0, 1, 2}, {2, 0, 1}, {1, 2, 0}}) {
    DetectionAccumulator merged = DetectionAccumulator::Unpack(packed[order[0]]);
    merged.Merge(DetectionAccumulator::Unpack(packed[order[1]]));
    merged.Merge(DetectionAccumulator::Unpack(packed[order[2]]));
    EXPECT_TRUE(SameMetrics(merged.Compute(), want));
  }
  // A packed accumulator unpacks to itself.
  EXPECT_EQ(DetectionAccumulator::Unpack(one.Pack()).Pack(), one.Pack());
  EXPECT_NE(ErrorOf([&] {
              std::vector<double> bad = one.Pack();
              bad.pop_back();
              DetectionAccumulator::Unpack(bad);
            }).find("needs"),
            std::string::npos);
}

TEST(DetectionMetrics, RowsParseAndBadRowsAreNamed) {
  // [item, label, score, box] and [item, label, instance, box, difficult]; -1 rows skipped.
  const float det_rows[] = {0,  2,  0.5f, 0.1f, 0.2f, 0.3f,  0.4f, -1, -1, -1, -1,
                            -1, -1, -1,   1,    1,    0.25f, 0,    0,  1,  1};
  const std::vector<Detection> dets = ParseDetections(det_rows, 3, 2, 2);
  ASSERT_EQ(dets.size(), 2u);
  EXPECT_EQ(dets[1].item, 1);
  EXPECT_EQ(dets[0].label, 2);
  EXPECT_NEAR(dets[0].box.ymax, 0.4, 1e-7);
  const float gt_rows[] = {1, 1, 0, 0.1f, 0.1f, 0.2f, 0.2f, 1};
  const std::vector<GroundTruth> gts = ParseGroundTruth(gt_rows, 1, 2, 2);
  ASSERT_EQ(gts.size(), 1u);
  EXPECT_TRUE(gts[0].difficult);
  EXPECT_NE(ErrorOf([&] {
              ParseDetections(det_rows, 3, 1, 2);
            }).find("detection row 0 has class 2; classes are 1 to 1"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              ParseGroundTruth(gt_rows, 1, 2, 1);
            }).find("ground-truth row 0 names item 1; the batch has items 0 to 0"),
            std::string::npos);
  // A box whose max corner lies before its min corner has no area to measure.
  DetectionAccumulator acc(2);
  const std::vector<Detection> inverted = {{0, 1, 0.5, {0.3, 0.2, 0.1, 0.4}}};
  EXPECT_NE(ErrorOf([&] {
              acc.Add(inverted, {}, Images(0, 1));
            }).find("a detection of item 0 (class 1) has the box [0.3, 0.2, 0.1, 0.4]"),
            std::string::npos);
  const std::vector<GroundTruth> flat = {{0, 2, {0.1, 0.5, 0.2, 0.4}, false}};
  EXPECT_NE(ErrorOf([&] { acc.Add({}, flat, Images(0, 1)); }).find("max corner"),
            std::string::npos);
}

TEST(DetectionMetrics, JsonSummaryAndCocoResults) {
  DetectionAccumulator acc(2);
  const std::vector<GroundTruth> boxes = {{0, 1, {0.1, 0.1, 0.5, 0.5}, false}};
  const std::vector<Detection> dets = {{0, 1, 0.9, {0.1, 0.1, 0.5, 0.5}},
                                       {1, 2, 0.4, {0.5, 0.25, 1.0, 0.75}}};
  const std::vector<ImageInfo> images = {{0, 42, 640, 480}, {1, 43, 200, 100}};
  acc.Add(dets, boxes, images);
  const nlohmann::ordered_json j = MetricsJson(acc.Compute(), /*voc07=*/true, {"cat", "dog"});
  EXPECT_DOUBLE_EQ(j["map50"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["map"].get<double>(), 1.0);
  EXPECT_TRUE(j["classes"]["dog"]["ap50"].is_null());  // no box of class 2
  EXPECT_EQ(j["classes"]["dog"]["detections"], 1);

  CocoResults results({1, 18});  // COCO's category ids of classes 1 and 2
  results.Add(dets, images);
  TempDir dir;
  results.Write(dir / "results.json");
  const nlohmann::json r = nlohmann::json::parse(testing::ReadFileBytes(dir / "results.json"));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["image_id"], 42);
  EXPECT_EQ(r[0]["category_id"], 1);
  EXPECT_EQ(r[1]["image_id"], 43);
  EXPECT_EQ(r[1]["category_id"], 18);
  const std::vector<double> bbox = r[1]["bbox"];  // [x, y, w, h] in the 200 x 100 image
  ASSERT_EQ(bbox.size(), 4u);
  EXPECT_DOUBLE_EQ(bbox[0], 100);
  EXPECT_DOUBLE_EQ(bbox[1], 25);
  EXPECT_DOUBLE_EQ(bbox[2], 100);
  EXPECT_DOUBLE_EQ(bbox[3], 50);
  EXPECT_DOUBLE_EQ(r[1]["score"].get<double>(), 0.4);
  EXPECT_NE(ErrorOf([&] {
              CocoResults unsized;
              unsized.Add(dets, Images(0, 2, 0, 0));
            }).find("has no size"),
            std::string::npos);
}

}  // namespace
}  // namespace cortado::detection
