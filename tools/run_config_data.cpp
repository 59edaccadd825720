// The run config's data: section and data.synthetic (run_config_sections.h): the source and its
// paths, batches, loader threads and augmentation.
#include <filesystem>
#include <span>

#include "tools/run_config_sections.h"

namespace cortado::run_config {
namespace {

// "'PATH' does not exist"; a relative path names the folder it was resolved against (the working
// directory, not the config's folder), since that is where a user starting elsewhere looks.
std::string Missing(const std::string& path) {
  std::string message = "'" + path + "' does not exist";
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  if (std::filesystem::path(path).is_relative() && !ec) {
    message += " (a relative path is resolved against the working directory, " + cwd.string() +
               ", not the config's folder)";
  }
  return message;
}

// data.train and data.val: required where training needs them, and present on this machine
// where the data is read.
void ParseDataPaths(const YamlSection& d, DataOptions& o, bool need_train, bool check_data) {
  o.train = d.String("train", "");
  o.val = d.String("val", "");
  if (o.type != "synthetic" && need_train) {
    Require(!o.train.empty(), d, "train", "is required (path to the training data)");
    Require(!check_data || std::filesystem::exists(o.train), d, "train", Missing(o.train));
  }
  if (o.type != "synthetic" && check_data) {
    Require(o.val.empty() || std::filesystem::exists(o.val), d, "val", Missing(o.val));
  }
}

// The random-resized-crop range [min, max] of data.scale or data.ratio.
std::vector<double> ParseRange(const YamlSection& d, const std::string& key, double min, double max,
                               bool at_most_one) {
  std::vector<double> range = d.Floats(key, {min, max});
  Require(
      range.size() == 2 && range[0] > 0 && range[0] <= range[1] && (!at_most_one || range[1] <= 1),
      d, key,
      at_most_one ? "must be [min, max] with 0 < min <= max <= 1"
                  : "must be [min, max] with 0 < min <= max");
  return range;
}

// The keys of one task only: given with the other, they are refused naming the task.
constexpr const char* kClassificationOnlyKeys[] = {"crop", "val_resize", "scale", "ratio"};
constexpr const char* kDetectionOnlyKeys[] = {"resize", "label_map",        "distort",
                                              "expand", "max_expand_ratio", "iou_crop"};

// data.task: detection: the output size, the label map and SSD's augmentation switches.
void ParseDetection(const YamlSection& d, DataOptions& o, bool check_data) {
  o.resize = d.Int("resize", o.resize);
  Require(o.resize >= 1 && o.resize <= 16384, d, "resize", "must be in 1..16384");
  o.label_map = d.String("label_map", "");
  Require(!check_data || o.label_map.empty() || std::filesystem::exists(o.label_map), d,
          "label_map", Missing(o.label_map));
  o.distort = d.Bool("distort", o.distort);
  o.expand = d.Bool("expand", o.expand);
  o.max_expand_ratio = d.Float("max_expand_ratio", o.max_expand_ratio);
  Require(o.max_expand_ratio >= 1 && o.max_expand_ratio <= 16, d, "max_expand_ratio",
          "must be in [1, 16]");
  o.iou_crop = d.Bool("iou_crop", o.iou_crop);
}

// Classification's crops: the output size and RandomResizedCrop's ranges.
void ParseClassification(const YamlSection& d, DataOptions& o) {
  o.crop = d.Int("crop", o.crop);
  Require(o.crop >= 1, d, "crop", "must be a positive integer");
  o.val_resize = d.Int("val_resize", o.val_resize);
  Require(o.val_resize >= o.crop, d, "val_resize", "must be >= crop");
  const std::vector<double> scale = ParseRange(d, "scale", o.scale_min, o.scale_max, true);
  o.scale_min = scale[0];
  o.scale_max = scale[1];
  const std::vector<double> ratio = ParseRange(d, "ratio", o.ratio_min, o.ratio_max, false);
  o.ratio_min = ratio[0];
  o.ratio_max = ratio[1];
}

void ParseSynthetic(const YamlSection& syn, DataOptions& o) {
  o.synthetic_shape = syn.Ints("shape", o.synthetic_shape);
  Require(o.synthetic_shape.size() == 3, syn, "shape", "must be [C, H, W]");
  o.synthetic_classes = syn.Int("classes", o.synthetic_classes);
  Require(o.synthetic_classes >= 1, syn, "classes", "must be >= 1");
  o.synthetic_samples = syn.Int("samples", o.synthetic_samples);
  Require(o.synthetic_samples >= 1, syn, "samples", "must be >= 1");
  o.synthetic_val_samples = syn.Int("val_samples", o.synthetic_val_samples);
  Require(o.synthetic_val_samples >= 0, syn, "val_samples", "must be >= 0 (0: no evaluation)");
}

}  // namespace

constexpr std::string_view kDataKeys[] = {"type",       "task",
                                          "train",      "val",
                                          "batch_size", "val_batch_size",
                                          "threads",    "prefetch",
                                          "shuffle",    "flip",
                                          "drop_last",  "mean",
                                          "std",        "crop",
                                          "val_resize", "scale",
                                          "ratio",      "resize",
                                          "label_map",  "distort",
                                          "expand",     "max_expand_ratio",
                                          "iou_crop",   "synthetic"};

constexpr std::string_view kSyntheticKeys[] = {"shape", "classes", "samples", "val_samples"};

std::span<const std::string_view> DataKeys() { return kDataKeys; }

std::span<const std::string_view> SyntheticKeys() { return kSyntheticKeys; }

DataOptions ParseData(const YamlSection& d, const YamlSection& syn, bool need_train,
                      bool check_data) {
  DataOptions o;
  o.type = d.String("type", o.type);
  Require(o.type == "idx" || o.type == "lmdb" || o.type == "synthetic", d, "type",
          "must be idx, lmdb or synthetic, got '" + o.type + "'");
  o.task = d.String("task", o.task);
  Require(o.task == "classification" || o.task == "detection", d, "task",
          "must be classification or detection, got '" + o.task + "'");
  const bool detection = o.task == "detection";
  Require(!detection || o.type == "lmdb", d, "task",
          "detection reads an LMDB of detection records (data.type: lmdb), not " + o.type);
  const std::span<const char* const> other_task =
      detection ? std::span<const char* const>(kClassificationOnlyKeys) : kDetectionOnlyKeys;
  for (const char* key : other_task) {
    Require(!d.Has(key), d, key,
            detection ? "is for classification; detection resizes whole images to data.resize"
                      : "is for data.task: detection");
  }
  ParseDataPaths(d, o, need_train, check_data);
  o.batch_size = d.Int("batch_size", o.batch_size);
  Require(o.batch_size >= 1, d, "batch_size", "must be a positive integer");
  o.val_batch_size = d.Int("val_batch_size", 0);
  Require(o.val_batch_size >= 0, d, "val_batch_size", "must be >= 1 (or 0: batch_size)");
  o.threads = static_cast<int>(d.Int("threads", 0));
  Require(o.threads >= 0, d, "threads", "must be >= 0 (0: the thread budget)");
  o.prefetch = static_cast<int>(d.Int("prefetch", o.prefetch));
  Require(o.prefetch >= 1, d, "prefetch", "must be >= 1");
  o.shuffle = d.Bool("shuffle", o.shuffle);
  o.flip = d.Bool("flip", detection || o.flip);  // SSD's recipe flips
  o.drop_last = d.Bool("drop_last", o.drop_last);
  o.mean = d.Floats("mean", {});
  o.std = d.Floats("std", {});
  for (double s : o.std) Require(s > 0, d, "std", "values must be positive");
  // Each task reads its own keys only: a key read records its default in the resolved config,
  // which a checkpoint stores and `cortado eval` parses again.
  if (detection) {
    ParseDetection(d, o, check_data);
  } else {
    ParseClassification(d, o);
  }
  ParseSynthetic(syn, o);
  return o;
}

}  // namespace cortado::run_config
