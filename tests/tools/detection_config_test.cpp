// The data section of a detection config (data.task: detection): SSD's defaults, the keys that
// belong to one task only refused with their place when given with the other, and the checks
// of each value.
#include <gtest/gtest.h>

#include "engine/base/error.h"
#include "engine/io/yaml_config.h"
#include "tests/support/errors.h"
#include "tools/run_config.h"

namespace cortado {
namespace {

const char* kDetection =
    "model: {builder: lenet, num_classes: 21}\n"
    "data:\n"
    "  type: lmdb\n"
    "  task: detection\n"
    "  train: voc0712_trainval_lmdb\n"
    "  val: voc07_test_lmdb\n"
    "  batch_size: 32\n"
    "solver: {max_iter: 10}\n";

RunConfig Parse(const std::string& text, const std::vector<std::string>& sets = {}) {
  YamlConfig yaml = YamlConfig::FromString(text, "ssd.yaml");
  for (const std::string& s : sets) yaml.Set(s);
  return ParseRunConfig(yaml, /*need_train=*/true, /*check_data=*/false);
}

std::string ErrorOf(const std::string& text, const std::vector<std::string>& sets = {}) {
  return testing::ErrorOf([&] { Parse(text, sets); });
}

TEST(DetectionConfig, DefaultsAreSsdsRecipe) {
  const DataOptions d = Parse(kDetection).data;
  EXPECT_EQ(d.task, "detection");
  EXPECT_EQ(d.resize, 300);
  EXPECT_TRUE(d.flip);
  EXPECT_TRUE(d.distort);
  EXPECT_TRUE(d.expand);
  EXPECT_EQ(d.max_expand_ratio, 4.0);
  EXPECT_TRUE(d.iou_crop);
  EXPECT_EQ(d.label_map, "");
  // Classification keeps its own defaults (no flip unless asked).
  const DataOptions c = Parse(kDetection, {"data.task=classification"}).data;
  EXPECT_EQ(c.task, "classification");
  EXPECT_FALSE(c.flip);

  const DataOptions set =
      Parse(kDetection, {"data.resize=512", "data.flip=false", "data.distort=false",
                         "data.expand=false", "data.max_expand_ratio=2", "data.iou_crop=false",
                         "data.label_map=labelmap_voc.prototxt"})
          .data;
  EXPECT_EQ(set.resize, 512);
  EXPECT_FALSE(set.flip);
  EXPECT_FALSE(set.distort);
  EXPECT_FALSE(set.expand);
  EXPECT_EQ(set.max_expand_ratio, 2.0);
  EXPECT_FALSE(set.iou_crop);
  EXPECT_EQ(set.label_map, "labelmap_voc.prototxt");
}

TEST(DetectionConfig, EachTasksKeysAreRefusedWithTheOther) {
  std::string m = ErrorOf(
      "model: {builder: lenet}\ndata:\n  type: lmdb\n  task: detection\n  train: t\n"
      "  crop: 224\nsolver: {max_iter: 1}\n");
  EXPECT_NE(m.find("ssd.yaml:6:9: data.crop: is for classification; detection resizes whole "
                   "images to data.resize"),
            std::string::npos)
      << m;
  m = ErrorOf(kDetection, {"data.task=classification", "data.iou_crop=false"});
  EXPECT_NE(m.find("data.iou_crop: is for data.task: detection"), std::string::npos) << m;
  EXPECT_NE(m.find("--set data.iou_crop=false"), std::string::npos) << m;
  m = ErrorOf(kDetection, {"data.task=segmentation"});
  EXPECT_NE(m.find("data.task: must be classification or detection, got 'segmentation'"),
            std::string::npos)
      << m;
  m = ErrorOf(kDetection, {"data.type=idx"});
  EXPECT_NE(m.find("data.task: detection reads an LMDB of detection records (data.type: lmdb), "
                   "not idx"),
            std::string::npos)
      << m;
  m = ErrorOf(kDetection, {"data.resize=0"});
  EXPECT_NE(m.find("data.resize: must be in 1..16384"), std::string::npos) << m;
  m = ErrorOf(kDetection, {"data.max_expand_ratio=0.5"});
  EXPECT_NE(m.find("data.max_expand_ratio: must be in [1, 16]"), std::string::npos) << m;
  m = ErrorOf(kDetection, {"data.iou_crp=true"});
  EXPECT_NE(m.find("unknown key 'data.iou_crp' (did you mean 'iou_crop'?)"), std::string::npos)
      << m;
}

TEST(DetectionConfig, AMissingLabelMapIsNamed) {
  YamlConfig yaml = YamlConfig::FromString(
      "model: {builder: lenet, num_classes: 3}\ndata:\n  type: lmdb\n  task: detection\n"
      "  train: /\n  label_map: /no/such/labelmap.prototxt\nsolver: {max_iter: 1}\n",
      "ssd.yaml");
  const std::string m = testing::ErrorOf([&] { ParseRunConfig(yaml); });
  EXPECT_NE(m.find("ssd.yaml:6:14: data.label_map: '/no/such/labelmap.prototxt' does not exist"),
            std::string::npos)
      << m;
}

}  // namespace
}  // namespace cortado
