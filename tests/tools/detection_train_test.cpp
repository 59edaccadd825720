// Detection end to end, as a user runs it: VOC-layout sets of coloured rectangles (classes
// blue, green and red on a dark noisy ground), converted with `cortado convert`, trained with
// ssd_lite and evaluated:
//   - training lowers the loss; the evaluation during training and `cortado eval --json` report
//     map50 and map with per-class figures, and --detections writes COCO results JSON;
//   - eval's mAP equals tools/detection_eval's on the detections of that file;
//   - 2 ranks (`cortado launch`, per-rank batch 2, synchronized batch norm, fp64) change the
//     weights as one process with batch 4 does, and evaluate to the same figures;
//   - a run interrupted and resumed ends with the uninterrupted run's weights, bit for bit;
//   - configs/ssd300_voc.yaml's dry run builds SSD300 and stops only at the missing data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "engine/io/checkpoint.h"
#include "tests/data/test_images.h"
#include "tests/support/files.h"
#include "tests/tools/fashion_slice.h"
#include "tests/tools/user_run.h"
#include "tools/detection_eval.h"
#include "tools/trainer.h"

namespace cortado::tooltest {
namespace {

namespace fs = std::filesystem;

constexpr int kSide = 64;

// One object: class (1 blue, 2 green, 3 red, as convert numbers the sorted names) and its
// pixels [x0, x1) x [y0, y1).
struct Rect {
  int label = 1;
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

const char* const kNames[] = {"", "blue", "green", "red"};

class DetectionTrainTest : public UserRun {
 protected:
  // A VOC root of `count` images per split; `objects(i)` gives image i's rectangles.
  void WriteSplit(const std::string& root, const std::string& split, int count,
                  const std::function<std::vector<Rect>(int)>& objects) {
    std::string list;
    for (int i = 0; i < count; ++i) {
      const std::string id = StrCat(split, "_", i);
      std::mt19937 rng(static_cast<uint32_t>(1000 + i + (split == "test" ? 500 : 0)));
      ImageU8 img;
      img.Reshape(kSide, kSide, 3);
      for (uint8_t& p : img.pixels) p = static_cast<uint8_t>(15 + rng() % 20);
      std::string xml = StrCat("<annotation><size><width>", kSide, "</width><height>", kSide,
                               "</height><depth>3</depth></size>");
      for (const Rect& r : objects(i)) {
        const uint8_t colour[3] = {static_cast<uint8_t>(r.label == 3 ? 220 : 40),
                                   static_cast<uint8_t>(r.label == 2 ? 220 : 40),
                                   static_cast<uint8_t>(r.label == 1 ? 220 : 40)};
        for (int y = r.y0; y < r.y1; ++y) {
          for (int x = r.x0; x < r.x1; ++x) std::memcpy(img.row(y) + x * 3, colour, 3);
        }
        // VOC counts pixels from 1 and includes the last one.
        xml += StrCat("<object><name>", kNames[r.label], "</name><difficult>0</difficult>",
                      "<bndbox><xmin>", r.x0 + 1, "</xmin><ymin>", r.y0 + 1, "</ymin><xmax>", r.x1,
                      "</xmax><ymax>", r.y1, "</ymax></bndbox></object>");
        truth_[split].push_back({i, r});
      }
      Write(root + "/JPEGImages/" + id + ".jpg", testing::EncodeJpeg(img, 95));
      Write(root + "/Annotations/" + id + ".xml", xml + "</annotation>");
      list += id + "\n";
    }
    Write(root + "/ImageSets/Main/" + split + ".txt", list);
  }

  // Converts the root's trainval and test splits; returns the databases.
  std::pair<std::string, std::string> ConvertBoth(const std::string& root) {
    const std::string r = (dir_ / root).string();
    const std::string train = r + "/trainval_lmdb", test = r + "/test_lmdb";
    std::string out, err;
    EXPECT_EQ(Cortado("convert --root " + r + " --split trainval --out " + train, &out, &err), 0)
        << err;
    EXPECT_EQ(Cortado("convert --root " + r + " --split test --out " + test + " --label-map " +
                          train + "/labelmap.prototxt",
                      &out, &err),
              0)
        << err;
    return {train, test};
  }

  // Images of 1 or 2 rectangles of 14..30 pixels at random places, random classes.
  std::pair<std::string, std::string> VariedSet(int train, int test) {
    auto objects = [](int i) {
      std::mt19937 rng(static_cast<uint32_t>(7 * i + 1));
      std::vector<Rect> rects;
      const int n = 1 + static_cast<int>(rng() % 2);
      for (int k = 0; k < n; ++k) {
        Rect r;
        r.label = 1 + static_cast<int>(rng() % 3);
        const int w = 14 + static_cast<int>(rng() % 17), h = 14 + static_cast<int>(rng() % 17);
        // Two objects take the left and the right half, so they do not overlap.
        const int left = n == 1 ? 0 : k * kSide / 2, room = (n == 1 ? kSide : kSide / 2) - w;
        r.x0 = left + static_cast<int>(rng() % static_cast<uint32_t>(room));
        r.y0 = static_cast<int>(rng() % static_cast<uint32_t>(kSide - h));
        r.x1 = r.x0 + w;
        r.y1 = r.y0 + h;
        rects.push_back(r);
      }
      return rects;
    };
    WriteSplit("varied", "trainval", train, objects);
    WriteSplit("varied", "test", test, objects);
    return ConvertBoth("varied");
  }

  // Every image holds its two rectangles at the same places (classes vary), so each image
  // matches the same number of priors: MultiBoxLoss normalizes by the positives of each rank's
  // batch (as torchvision's and Caffe SSD's multi-GPU training do), which equals one process's
  // normalization only where every rank's batch has as many positives.
  std::pair<std::string, std::string> AlignedSet(int train, int test) {
    auto objects = [](int i) {
      return std::vector<Rect>{{1 + i % 3, 8, 8, 26, 28}, {1 + (i / 3) % 3, 36, 30, 58, 54}};
    };
    WriteSplit("aligned", "trainval", train, objects);
    WriteSplit("aligned", "test", test, objects);
    return ConvertBoth("aligned");
  }

  std::string Config(const std::string& name, const std::pair<std::string, std::string>& data,
                     const std::string& extra_data, const std::string& solver) {
    return Write(
        name + ".yaml",
        StrCat("seed: 3\n", "model: {builder: ssd_lite}\n", "data:\n", "  type: lmdb\n",
               "  task: detection\n", "  train: ", data.first, "\n", "  val: ", data.second, "\n",
               "  batch_size: 4\n", "  resize: 64\n", "  mean: [0.1, 0.1, 0.1]\n",
               "  std: [0.3, 0.3, 0.3]\n", extra_data,
               "solver: {momentum: 0.9, weight_decay: 1.0e-4, lr_policy: fixed, ", solver, "}\n",
               "checkpoint: {dir: ", (dir_ / name).string(), "}\n", "log: {interval: 1}\n"));
  }

  // The losses of the "train" events of a metrics file, in order.
  static std::vector<double> Losses(const std::string& path) {
    std::vector<double> out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("event", "") == "train") out.push_back(j["loss"].get<double>());
    }
    return out;
  }

  std::map<std::string, std::vector<std::pair<int, Rect>>> truth_;
};

const char* kNoAugmentation =
    "  distort: false\n  expand: false\n  iou_crop: false\n  flip: false\n";

TEST_F(DetectionTrainTest, TrainsAndEvaluatesWithMapFiguresAndResultsFile) {
  const auto data = VariedSet(32, 12);
  const std::string config =
      Config("varied_run", data, kNoAugmentation, "base_lr: 0.02, max_iter: 40, eval_interval: 20");
  const std::string metrics = (dir_ / "metrics.jsonl").string();
  std::string out, err;
  ASSERT_EQ(Cortado("train --no-progress --threads 2 --config " + config + " --metrics " + metrics,
                    &out, &err),
            0)
      << err;
  const std::vector<double> losses = Losses(metrics);
  ASSERT_EQ(losses.size(), 40u);
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    first += losses[static_cast<size_t>(i)];
    last += losses[losses.size() - 1 - static_cast<size_t>(i)];
  }
  EXPECT_LT(last, 0.7 * first) << "the loss did not fall: first 8 sum " << first << ", last 8 "
                               << last;
  // Two evaluations during training, with the detection figures.
  int evals = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("event", "") != "eval") continue;
    ++evals;
    EXPECT_TRUE(j.contains("map50") && j.contains("map")) << line;
    EXPECT_FALSE(j.contains("top1")) << line;
  }
  EXPECT_EQ(evals, 2);
  EXPECT_NE(err.find("mAP@0.5 "), std::string::npos) << err;

  // cortado eval --json with the results file.
  const std::string results = (dir_ / "detections.json").string();
  ASSERT_EQ(Cortado("eval --threads 2 --config " + config +
                        " --checkpoint auto --json --no-progress --detections " + results,
                    &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  for (const char* key : {"map50", "map", "map50_11point", "map50_area", "loss", "classes"}) {
    EXPECT_TRUE(j.contains(key)) << key << " missing: " << out;
  }
  EXPECT_EQ(j["images"], 12);
  for (const char* name : {"blue", "green", "red"}) {
    ASSERT_TRUE(j["classes"].contains(name)) << out;
    EXPECT_TRUE(j["classes"][name].contains("ap50") && j["classes"][name].contains("ap"));
  }
  EXPECT_EQ(j["map50"], j["map50_11point"]);

  // The results file, read back into tools/detection_eval with the ground truth written above,
  // gives eval's figures: the rows of image_id (the record's index: the list's order) with
  // pixel boxes [x, y, w, h].
  const nlohmann::json rows = nlohmann::json::parse(testing::ReadFileBytes(results));
  ASSERT_TRUE(rows.is_array());
  ASSERT_GT(rows.size(), 0u);
  detection::DetectionAccumulator acc(3);
  for (int image = 0; image < 12; ++image) {
    std::vector<detection::Detection> dets;
    for (const nlohmann::json& r : rows) {
      if (r["image_id"].get<int>() != image) continue;
      const std::vector<double> b = r["bbox"].get<std::vector<double>>();
      dets.push_back({0,
                      r["category_id"].get<int>(),
                      r["score"].get<double>(),
                      {b[0] / kSide, b[1] / kSide, (b[0] + b[2]) / kSide, (b[1] + b[3]) / kSide}});
    }
    std::vector<detection::GroundTruth> boxes;
    for (const auto& [i, r] : truth_["test"]) {
      if (i != image) continue;
      boxes.push_back(
          {0,
           r.label,
           {double(r.x0) / kSide, double(r.y0) / kSide, double(r.x1) / kSide, double(r.y1) / kSide},
           false});
    }
    const detection::ImageInfo info{image, image, kSide, kSide};
    acc.Add(dets, boxes, std::span<const detection::ImageInfo>(&info, 1));
  }
  const detection::DetectionMetrics m = acc.Compute();
  EXPECT_NEAR(j["map50"].get<double>(), m.voc07_map, 1e-9);
  EXPECT_NEAR(j["map50_area"].get<double>(), m.voc_map, 1e-9);
  EXPECT_NEAR(j["map"].get<double>(), m.coco_map, 1e-9);

  // The text report: a table of the classes and the means.
  ASSERT_EQ(Cortado("eval --threads 2 --config " + config + " --checkpoint auto --no-progress",
                    &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("mAP@0.5 "), std::string::npos) << out;
  EXPECT_NE(out.find("mAP@[.5:.95] "), std::string::npos) << out;
  EXPECT_NE(out.find("\ngreen "), std::string::npos) << out;
}

// ||a - b|| / ||b - start|| over the tensors named `prefix`*: what the runs changed, compared.
double RelativeChange(const Checkpoint& a, const Checkpoint& b, const Checkpoint& start,
                      const std::string& prefix) {
  double diff = 0, norm = 0;
  for (const auto& [name, t] : b.tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    const Tensor* u = a.Find(name);
    const Tensor* s = start.Find(name);
    if (u == nullptr || s == nullptr || u->numel() != t.numel()) return INFINITY;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = ElementAsDouble(*u, i), y = ElementAsDouble(t, i);
      diff += (x - y) * (x - y);
      norm += (y - ElementAsDouble(*s, i)) * (y - ElementAsDouble(*s, i));
    }
  }
  return norm > 0 ? std::sqrt(diff / norm) : INFINITY;
}

TEST_F(DetectionTrainTest, TwoRanksEqualOneProcess) {
  const auto data = AlignedSet(16, 6);
  const std::string config =
      Config("aligned_run", data, kNoAugmentation + std::string("  shuffle: true\n"),
             "base_lr: 0.01, max_iter: 3, eval_interval: 0");
  const std::string common = " --no-progress --threads 1 --config " + config +
                             " --set precision.compute=fp64 --set distributed.sync_bn=true";
  Checkpoint start;
  Trainer(LoadRunConfig(config, {"precision.compute=fp64"})).net().SaveState(start);
  std::string out, err;
  const std::string one = (dir_ / "one").string(), two = (dir_ / "two").string();
  ASSERT_EQ(Cortado("train" + common + " --set checkpoint.dir=" + one, &out, &err), 0) << err;
  ASSERT_EQ(
      RunShell("timeout 300 " + CortadoBinary() + " launch --nproc 2 -- " + CortadoBinary() +
                   " train" + common + " --set data.batch_size=2" + " --set checkpoint.dir=" + two,
               &out, &err),
      0)
      << err;
  const Checkpoint a = LoadCheckpoint(ListCheckpoints(one)[0]);
  const Checkpoint b = LoadCheckpoint(ListCheckpoints(two)[0]);
  const double params = RelativeChange(b, a, start, "param/");
  const double buffers = RelativeChange(b, a, start, "buffer/");
  EXPECT_LT(params, 1e-9);
  EXPECT_LT(buffers, 1e-9);
  std::printf("2 ranks against 1: parameters %.3g, buffers %.3g of the update\n", params, buffers);

  // Evaluation over 2 ranks gives one process's figures.
  const std::string eval = CortadoBinary() + " eval --threads 1 --json --no-progress --config " +
                           config + " --set precision.compute=fp64 --checkpoint " +
                           ListCheckpoints(one)[0];
  std::string out1, out2;
  ASSERT_EQ(RunShell("timeout 120 " + eval, &out1, &err), 0) << err;
  ASSERT_EQ(
      RunShell("timeout 120 " + CortadoBinary() + " launch --nproc 2 -- " + eval, &out2, &err), 0)
      << err;
  // The launcher prefixes rank 0's line with "[0] ".
  const nlohmann::json j1 = nlohmann::json::parse(out1);
  const nlohmann::json j2 = nlohmann::json::parse(out2.substr(out2.find('{')));
  EXPECT_EQ(j1["images"], 6);
  EXPECT_EQ(j2["images"], 6);
  EXPECT_EQ(j1["map50"], j2["map50"]);
  EXPECT_EQ(j1["map"], j2["map"]);
  EXPECT_EQ(j1["classes"], j2["classes"]);
}

TEST_F(DetectionTrainTest, ResumeContinuesAsAnUninterruptedRun) {
  const auto data = VariedSet(16, 4);
  // SSD's augmentation on: a resumed run must draw the same crops, flips and colours.
  const std::string config = Config("resume_run", data, "  max_expand_ratio: 2\n",
                                    "base_lr: 0.01, max_iter: 6, eval_interval: 0");
  auto run = [&](const std::string& folder, int64_t stop_at, const std::string& resume) {
    Trainer t(LoadRunConfig(config, {"checkpoint.dir=" + (dir_ / folder).string()}));
    TrainOptions o;
    o.stop_at = stop_at;
    o.resume = resume;
    return t.Run(o);
  };
  ASSERT_EQ(run("a", 0, ""), 0);
  ASSERT_EQ(run("b", 3, ""), 130);
  ASSERT_EQ(run("b", 0, "auto"), 0);
  const Checkpoint ca = LoadCheckpoint(ListCheckpoints((dir_ / "a").string())[0]);
  const Checkpoint cb = LoadCheckpoint(ListCheckpoints((dir_ / "b").string())[0]);
  ASSERT_EQ(ca.tensors.size(), cb.tensors.size());
  for (size_t i = 0; i < ca.tensors.size(); ++i) {
    const Tensor& x = ca.tensors[i].second;
    const Tensor& y = cb.tensors[i].second;
    ASSERT_EQ(x.nbytes(), y.nbytes()) << ca.tensors[i].first;
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << ca.tensors[i].first;
  }
}

// The shipped SSD300 recipe on a machine without VOC: the dry run builds the whole net from the
// config and then stops at the first data path, as training would.
TEST_F(DetectionTrainTest, TheVocRecipeDryRunStopsOnlyAtItsData) {
  const std::string recipe = std::string(CORTADO_SOURCE_DIR) + "/configs/ssd300_voc.yaml";
  std::string out, err;
  EXPECT_EQ(Cortado("train --dry-run --config " + recipe + " --set data.batch_size=1", &out, &err),
            1);
  EXPECT_NE(out.find("total parameters: 26285486"), std::string::npos) << out;
  EXPECT_NE(err.find("data.train: 'voc/trainval0712_lmdb' does not exist"), std::string::npos)
      << err;
}

}  // namespace
}  // namespace cortado::tooltest
