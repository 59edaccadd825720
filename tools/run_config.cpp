#include "tools/run_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string_view>

#include "engine/error.h"
#include "engine/numbers.h"
#include "models/builders.h"

namespace cortado {
namespace {

std::string ScalarText(const YAML::Node& n) { return n.IsScalar() ? n.Scalar() : std::string(); }

// One entry of model.layers: name, type, inputs, outputs; every other key is a layer setting.
LayerSpec ParseLayer(const YamlConfig& yaml, const YAML::Node& node, size_t index) {
  std::string where = yaml.WhereOf(node, "");
  std::string path = StrCat("model.layers[", index, "]");
  CORTADO_CHECK(node.IsMap(), where, ": ", path, ": each layer must be a mapping");
  LayerSpec spec;
  spec.where = where;
  for (const auto& item : node) {
    CORTADO_CHECK(item.first.IsScalar(), where, ": ", path, ": a key is not a setting name");
    std::string key = item.first.as<std::string>();
    const YAML::Node& value = item.second;
    std::string at = yaml.WhereOf(value, "");
    auto names = [&]() {
      std::vector<std::string> out;
      if (value.IsScalar()) {
        out.push_back(value.Scalar());
      } else if (value.IsSequence()) {
        for (const auto& v : value) {
          CORTADO_CHECK(v.IsScalar(), at, ": ", path, ".", key, ": expected blob names");
          out.push_back(v.Scalar());
        }
      } else {
        Fail(at, ": ", path, ".", key, ": expected a blob name or a list of them");
      }
      return out;
    };
    if (key == "name") {
      spec.name = ScalarText(value);
    } else if (key == "type") {
      spec.type = ScalarText(value);
    } else if (key == "inputs" || key == "bottom") {
      spec.inputs = names();
    } else if (key == "outputs" || key == "top") {
      spec.outputs = names();
    } else if (value.IsScalar()) {
      spec.settings.Set(key, value.Scalar(), at);
    } else if (value.IsSequence()) {
      std::vector<std::string> items;
      for (const auto& v : value) {
        CORTADO_CHECK(v.IsScalar(), at, ": ", path, ".", key, ": lists must hold plain values");
        items.push_back(v.Scalar());
      }
      spec.settings.SetList(key, items, at);
    } else {
      Fail(at, ": ", path, ".", key, ": expected a value or a list of values");
    }
  }
  CORTADO_CHECK(!spec.name.empty(), where, ": ", path, ": missing 'name'");
  CORTADO_CHECK(!spec.type.empty(), where, ": ", path, " ('", spec.name, "'): missing 'type'");
  CORTADO_CHECK(!spec.outputs.empty() || spec.type == "Silence", where, ": ", path, " ('",
                spec.name, "'): missing 'outputs'");
  return spec;
}

void Require(bool ok, const YamlSection& s, const std::string& key, const std::string& what) {
  if (!ok) s.Error(key, what);
}

}  // namespace

RunConfig LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                        bool need_train, bool check_data) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  CORTADO_CHECK(fs::exists(st), "config file '", path, "' does not exist");
  if (fs::is_directory(st)) {
    std::vector<std::string> yamls;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const std::string ext = e.path().extension().string();
      if (ext == ".yaml" || ext == ".yml") yamls.push_back(e.path().string());
    }
    std::sort(yamls.begin(), yamls.end());
    std::string some;
    for (size_t i = 0; i < yamls.size() && i < 3; ++i) some += (i ? ", " : "") + yamls[i];
    Fail("config '", path, "' is a folder; expected a YAML config file",
         some.empty() ? std::string() : " such as " + some);
  }
  std::ifstream in(path);
  CORTADO_CHECK(in.good(), "cannot open config file '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  // Nothing but blank lines and comments: an empty config would fail on its first required
  // key, which says nothing about the real mistake (a wrong path).
  bool content = false;
  std::istringstream lines(text.str());
  for (std::string line; !content && std::getline(lines, line);) {
    const size_t first = line.find_first_not_of(" \t\r");
    content =
        first != std::string::npos && line[first] != '#' && line.compare(first, 3, "---") != 0;
  }
  CORTADO_CHECK(content, "config file '", path,
                "' is empty; expected a YAML mapping with model, "
                "data and solver sections (see configs/)");
  YamlConfig yaml = YamlConfig::FromString(text.str(), path);
  for (const std::string& o : overrides) yaml.Set(o);
  return ParseRunConfig(yaml, need_train, check_data);
}

namespace {

// Every section's keys, beside the function that reads them. Declare() checks the whole file
// against these lists before any value is read, so a misspelled key (max_iters, trian, buildr,
// a top-level solvr) is named as unknown with the closest key instead of being reported as the
// required key it was meant to be; a getter on a key missing from its list is an internal
// error, so the lists cannot drift from the getters.
constexpr std::string_view kTopKeys[] = {"seed",       "model",       "data",      "solver",
                                         "checkpoint", "distributed", "precision", "log"};

// The document's sections, each declared (checked against its key list) before any is read.
struct Sections {
  YamlSection root, model, data, synthetic, solver, checkpoint, distributed, precision, log;
};

constexpr std::string_view kModelKeys[] = {"builder",     "layers",          "num_classes",
                                           "in_channels", "label_smoothing", "zero_init_residual",
                                           "base_width",  "weights",         "weights_partial"};

ModelConfig ParseModel(const YamlConfig& yaml, const YamlSection& m) {
  ModelConfig model;
  model.builder = m.String("builder", "");
  const std::vector<std::string> builders = ModelNames();
  if (!model.builder.empty() &&
      std::find(builders.begin(), builders.end(), model.builder) == builders.end()) {
    std::string known;
    for (const std::string& b : builders) known += (known.empty() ? "" : ", ") + b;
    m.Error("builder", "unknown builder '" + model.builder + "' (known: " + known + ")");
  }
  if (m.Has("layers")) {
    YAML::Node layers = m.Node("layers");
    Require(layers.IsSequence(), m, "layers", "expected a list of layers");
    for (size_t i = 0; i < layers.size(); ++i)
      model.layers.push_back(ParseLayer(yaml, layers[i], i));
  }
  Require(model.builder.empty() != model.layers.empty(), m, "",
          "give exactly one of 'builder' (lenet, resnet20, ...) or 'layers' (a graph)");
  model.num_classes = m.Int("num_classes", 0);
  Require(model.num_classes >= 0, m, "num_classes", "must be >= 1 (or 0: from the data)");
  model.in_channels = m.Int("in_channels", 0);
  Require(model.in_channels >= 0, m, "in_channels", "must be >= 1 (or 0: from the data)");
  model.label_smoothing = m.Float("label_smoothing", 0.0);
  Require(model.label_smoothing >= 0 && model.label_smoothing < 1, m, "label_smoothing",
          "must be in [0, 1)");
  model.zero_init_residual = m.Bool("zero_init_residual", false);
  model.base_width = m.Int("base_width", 0);
  Require(model.base_width >= 0, m, "base_width", "must be >= 1 (or 0: the published 64)");
  Require(model.base_width == 0 || !model.builder.empty(), m, "base_width",
          "applies to the resnet18 ... resnet152 builders, not to a layers graph");
  model.weights = m.String("weights", "");
  model.weights_partial = m.Bool("weights_partial", false);
  return model;
}

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
// The keys of one task only: given with the other, they are refused naming the task.
constexpr const char* kClassificationOnlyKeys[] = {"crop", "val_resize", "scale", "ratio"};
constexpr const char* kDetectionOnlyKeys[] = {"resize", "label_map",        "distort",
                                              "expand", "max_expand_ratio", "iou_crop"};
constexpr std::string_view kSyntheticKeys[] = {"shape", "classes", "samples", "val_samples"};

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
  if (detection) ParseDetection(d, o, check_data);
  ParseSynthetic(syn, o);
  return o;
}

constexpr std::string_view kSolverKeys[] = {
    "base_lr",  "momentum",      "nesterov",     "weight_decay",  "no_decay_bn_bias", "max_epochs",
    "max_iter", "lr_policy",     "gamma",        "step_size",     "milestones",       "power",
    "min_lr",   "warmup_epochs", "warmup_iters", "warmup_factor", "eval_interval"};

// The warm-up key of the other schedule (warmup_iters where max_epochs is given alone), which
// ParseSchedule refuses naming the right one: never offered for a misspelled key. None while the
// schedule is unclear (ParseSolver then asks for exactly one of max_epochs or max_iter).
std::span<const std::string_view> OtherSchedulesKeys(const YamlSection& solver) {
  static constexpr std::string_view kEpochKeys[] = {"warmup_epochs"};
  static constexpr std::string_view kIterKeys[] = {"warmup_iters"};
  const bool epochs = solver.Has("max_epochs"), iters = solver.Has("max_iter");
  if (epochs == iters) return {};
  return epochs ? std::span<const std::string_view>(kIterKeys) : kEpochKeys;
}

// The schedule's shape after base_lr: policy, its parameters and the warm-up.
void ParseSchedule(const YamlSection& s, SolverConfig& sv) {
  LrScheduleOptions& lr = sv.schedule;
  const std::optional<LrPolicy> policy = FindLrPolicy(s.String("lr_policy", "cosine"));
  Require(policy.has_value(), s, "lr_policy", "must be one of " + LrPolicyNames());
  lr.policy = *policy;
  lr.gamma = s.Float("gamma", 0.1);
  Require(lr.gamma > 0, s, "gamma", "must be positive");
  lr.step_size = s.Float("step_size", 30);
  Require(lr.step_size > 0, s, "step_size", "must be positive");
  lr.milestones = s.Floats("milestones", {});
  lr.power = s.Float("power", 1.0);
  lr.min_lr = s.Float("min_lr", 0.0);
  Require(lr.min_lr >= 0 && lr.min_lr <= lr.base_lr, s, "min_lr", "must be in [0, base_lr]");
  const char* warmup_key = sv.epoch_based ? "warmup_epochs" : "warmup_iters";
  lr.warmup = s.Float(warmup_key, 0.0);
  Require(lr.warmup >= 0, s, warmup_key, "must be >= 0");
  if (s.Has(sv.epoch_based ? "warmup_iters" : "warmup_epochs")) {
    s.Error(sv.epoch_based ? "warmup_iters" : "warmup_epochs",
            StrCat("use ", warmup_key, " with ", sv.epoch_based ? "max_epochs" : "max_iter"));
  }
  lr.warmup_factor = s.Float("warmup_factor", 0.0);
  Require(lr.warmup_factor >= 0 && lr.warmup_factor <= 1, s, "warmup_factor", "must be in [0, 1]");
  lr.total = static_cast<double>(sv.epoch_based ? sv.max_epochs : sv.max_iter);
}

SolverConfig ParseSolver(const YamlSection& s) {
  SolverConfig sv;
  sv.schedule.base_lr = s.Float("base_lr", 0.1);
  Require(sv.schedule.base_lr > 0, s, "base_lr", "must be positive");
  sv.sgd.momentum = s.Float("momentum", 0.9);
  Require(sv.sgd.momentum >= 0 && sv.sgd.momentum < 1, s, "momentum", "must be in [0, 1)");
  sv.sgd.nesterov = s.Bool("nesterov", false);
  sv.sgd.weight_decay = s.Float("weight_decay", 5e-4);
  Require(sv.sgd.weight_decay >= 0, s, "weight_decay", "must be >= 0");
  sv.sgd.no_decay_bn_bias = s.Bool("no_decay_bn_bias", false);
  sv.max_epochs = s.Int("max_epochs", 0);
  sv.max_iter = s.Int("max_iter", 0);
  Require(sv.max_epochs >= 0, s, "max_epochs", "must be positive");
  Require(sv.max_iter >= 0, s, "max_iter", "must be positive");
  Require((sv.max_epochs > 0) != (sv.max_iter > 0), s, "",
          "give exactly one of max_epochs or max_iter");
  sv.epoch_based = sv.max_epochs > 0;
  ParseSchedule(s, sv);
  sv.eval_interval = s.Float("eval_interval", sv.epoch_based ? 1.0 : 0.0);
  Require(sv.eval_interval >= 0, s, "eval_interval", "must be >= 0");
  return sv;
}

constexpr std::string_view kCheckpointKeys[] = {"dir", "every", "keep"};

CheckpointConfig ParseCheckpoint(const YamlSection& k, const std::string& file, bool epoch_based) {
  CheckpointConfig ck;
  const std::string stem = std::filesystem::path(file).stem().string();
  ck.dir = k.String("dir", "runs/" + (stem.empty() ? std::string("run") : stem));
  ck.every = k.Float("every", epoch_based ? 1.0 : 0.0);
  Require(ck.every >= 0, k, "every", "must be >= 0");
  ck.keep = static_cast<int>(k.Int("keep", 3));
  Require(ck.keep >= 1, k, "keep", "must be >= 1");
  return ck;
}

constexpr std::string_view kDistributedKeys[] = {"backend",
                                                 "transport",
                                                 "bucket_mb",
                                                 "first_bucket_mb",
                                                 "last_bucket_mb",
                                                 "overlap",
                                                 "timeout_s",
                                                 "connect_timeout_s",
                                                 "sync_bn",
                                                 "sync_bn_group",
                                                 "codec",
                                                 "rounding",
                                                 "error_feedback",
                                                 "codec_keep_f32",
                                                 "codec_overrides",
                                                 "codec_candidates",
                                                 "auto_warmup_steps",
                                                 "auto_interval",
                                                 "auto_max_residual_ratio",
                                                 "auto_hiding_fraction",
                                                 "auto_trial_steps"};

// distributed.codec_keep_f32: the parameter kinds every codec leaves in f32.
void ParseKeepF32(const YamlSection& dd, CodecPolicy& codec) {
  if (!dd.Has("codec_keep_f32")) return;
  YAML::Node kinds = dd.Node("codec_keep_f32");
  if (!kinds.IsSequence()) dd.Error("codec_keep_f32", "must be a list of batch_norm, bias, weight");
  codec.keep_f32.clear();
  for (const auto& k : kinds) {
    const std::string kind = k.IsScalar() ? k.as<std::string>() : "";
    if (kind == "batch_norm") {
      codec.keep_f32.push_back(ParamKind::kNorm);
    } else if (kind == "bias") {
      codec.keep_f32.push_back(ParamKind::kBias);
    } else if (kind == "weight") {
      codec.keep_f32.push_back(ParamKind::kWeight);
    } else {
      dd.Error("codec_keep_f32",
               "unknown parameter kind '" + kind + "' (known: batch_norm, bias, weight)");
    }
  }
}

// distributed.codec_overrides: parameter-name patterns mapped to codecs.
void ParseCodecOverrides(const YamlSection& dd, CodecPolicy& codec) {
  if (!dd.Has("codec_overrides")) return;
  YAML::Node overrides = dd.Node("codec_overrides");
  if (!overrides.IsMap()) {
    dd.Error("codec_overrides", "must map parameter-name patterns to codecs, e.g. {\"fc.*\": f32}");
  }
  for (const auto& item : overrides) {
    if (!item.first.IsScalar()) {
      dd.Error("codec_overrides",
               "a key is not a name pattern (write patterns as strings, e.g. {\"fc.*\": f32})");
    }
    const std::string pattern = item.first.as<std::string>();
    const std::string name = item.second.IsScalar() ? item.second.as<std::string>() : "";
    try {
      codec.overrides.emplace_back(pattern, dist::CodecName(dist::ParseCodec(name)));
    } catch (const std::exception& e) {
      dd.Error("codec_overrides", "'" + pattern + "': " + e.what());
    }
  }
}

// distributed.codec, rounding and error_feedback: gradient compression.
void ParseCodec(const YamlSection& dd, DistributedConfig& dc) {
  dc.codec.codec = dd.String("codec", "f32");
  try {
    if (dc.codec.codec != "auto")
      dc.codec.codec = dist::CodecName(dist::ParseCodec(dc.codec.codec));
  } catch (const std::exception& e) {
    dd.Error("codec", std::string(e.what()) + " (or auto)");
  }
  AutoCodecOptions& ac = dc.auto_codec;
  ac.enabled = dc.codec.codec == "auto";
  if (ac.enabled) {
    // Read (and so resolved) only under auto.
    if (dd.Has("codec_candidates")) {
      YAML::Node list = dd.Node("codec_candidates");
      if (!list.IsSequence() || list.size() == 0) {
        dd.Error("codec_candidates", "must be a list of codecs, widest first, e.g. [f32, epgc8]");
      }
      ac.candidates.clear();
      for (const auto& item : list) {
        const std::string name = item.IsScalar() ? item.as<std::string>() : "";
        try {
          ac.candidates.push_back(dist::ParseCodec(name));
        } catch (const std::exception& e) {
          dd.Error("codec_candidates", e.what());
        }
        const size_t k = ac.candidates.size();
        if (k >= 2 &&
            dist::CodecBits(ac.candidates[k - 2]) <= dist::CodecBits(ac.candidates[k - 1])) {
          dd.Error("codec_candidates", std::string("must go from widest to narrowest, but ") +
                                           dist::CodecName(ac.candidates[k - 2]) +
                                           " comes before " +
                                           dist::CodecName(ac.candidates[k - 1]));
        }
      }
    }
    ac.warmup_steps = dd.Int("auto_warmup_steps", ac.warmup_steps);
    Require(ac.warmup_steps >= 1, dd, "auto_warmup_steps", "must be >= 1");
    ac.interval = dd.Int("auto_interval", ac.interval);
    Require(ac.interval >= 0, dd, "auto_interval", "must be >= 0 (0: plan once)");
    ac.max_residual_ratio = dd.Float("auto_max_residual_ratio", ac.max_residual_ratio);
    Require(ac.max_residual_ratio > 0, dd, "auto_max_residual_ratio", "must be > 0");
    ac.hiding_fraction = dd.Float("auto_hiding_fraction", ac.hiding_fraction);
    Require(ac.hiding_fraction > 0 && ac.hiding_fraction <= 1, dd, "auto_hiding_fraction",
            "must be in (0, 1]");
    ac.trial_steps = dd.Int("auto_trial_steps", ac.trial_steps);
    Require(ac.trial_steps >= 0, dd, "auto_trial_steps", "must be >= 0 (0: no trial)");
  } else {
    for (const char* key :
         {"codec_candidates", "auto_warmup_steps", "auto_interval", "auto_max_residual_ratio",
          "auto_hiding_fraction", "auto_trial_steps"}) {
      Require(!dd.Has(key), dd, key, "is for distributed.codec: auto");
    }
  }
  try {
    dc.rounding = dist::ParseRounding(dd.String("rounding", "nearest"));
  } catch (const std::exception& e) {
    dd.Error("rounding", e.what());
  }
  dc.error_feedback = dd.Bool("error_feedback", false);
  ParseKeepF32(dd, dc.codec);
  ParseCodecOverrides(dd, dc.codec);
}

// A bucket size in MB, in (0, 4096].
double BucketMb(const YamlSection& dd, const std::string& key, double fallback) {
  const double mb = dd.Float(key, fallback);
  Require(mb > 0 && mb <= 4096, dd, key, "must be in (0, 4096]");
  return mb;
}

DistributedConfig ParseDistributed(const YamlSection& dd) {
  DistributedConfig dc;
  dc.backend = dd.String("backend", "");
  Require(
      dc.backend.empty() || dc.backend == "cortado" || dc.backend == "tcp" || dc.backend == "mpi",
      dd, "backend", "must be cortado or mpi, got '" + dc.backend + "'");
  dc.transport = dd.String("transport", "");
  Require(dc.transport.empty() || dc.transport == "tcp" || dc.transport == "ucx", dd, "transport",
          "must be tcp or ucx, got '" + dc.transport + "'");
  dc.bucket_mb = BucketMb(dd, "bucket_mb", dc.bucket_mb);
  dc.first_bucket_mb = BucketMb(dd, "first_bucket_mb", dc.first_bucket_mb);
  dc.last_bucket_mb = BucketMb(dd, "last_bucket_mb", dc.last_bucket_mb);
  dc.overlap = dd.Bool("overlap", dc.overlap);
  dc.timeout_s = dd.Float("timeout_s", 0.0);
  Require(dc.timeout_s >= 0, dd, "timeout_s", "must be >= 0 (0: CORTADO_TIMEOUT_S, else 300)");
  dc.connect_timeout_s = dd.Float("connect_timeout_s", 0.0);
  Require(dc.connect_timeout_s >= 0, dd, "connect_timeout_s",
          "must be >= 0 (0: CORTADO_CONNECT_TIMEOUT_S, else timeout_s)");
  dc.sync_bn = dd.Bool("sync_bn", dc.sync_bn);
  const int64_t group = dd.Int("sync_bn_group", 0);
  Require(group >= 0 && group <= 1 << 20, dd, "sync_bn_group",
          "must be >= 1 (ranks per batch-norm group) or 0 (all ranks)");
  dc.sync_bn_group = static_cast<int>(group);
  ParseCodec(dd, dc);
  return dc;
}

constexpr std::string_view kPrecisionKeys[] = {
    "compute", "loss_scale", "init_scale", "growth_factor", "backoff_factor", "growth_interval"};

// precision.loss_scale: dynamic (with its growth and backoff), a static scale, or 1 (none).
void ParseLossScale(const YamlSection& pr, const std::string& compute, PrecisionConfig& p) {
  LossScalerOptions& so = p.scaler;
  const std::string loss_scale = pr.String("loss_scale", compute == "fp16" ? "dynamic" : "1");
  if (loss_scale == "dynamic") {
    // Read (and so resolved) only here: with a static scale they must stay absent.
    so.init_scale = pr.Float("init_scale", so.init_scale);
    so.growth_factor = pr.Float("growth_factor", so.growth_factor);
    so.backoff_factor = pr.Float("backoff_factor", so.backoff_factor);
    so.growth_interval = pr.Int("growth_interval", so.growth_interval);
    so.dynamic = true;
    p.loss_scaling = true;
  } else {
    double value = 0;
    const bool number = ParseFiniteDouble(loss_scale, &value);
    Require(number && value > 0, pr, "loss_scale",
            "must be dynamic or a positive number, got '" + loss_scale + "'");
    so.dynamic = false;
    so.init_scale = value;
    p.loss_scaling = value != 1.0;
    Require(!pr.Has("init_scale") && !pr.Has("growth_interval") && !pr.Has("growth_factor") &&
                !pr.Has("backoff_factor"),
            pr, "loss_scale",
            "is static ('" + loss_scale +
                "'); init_scale, growth_factor, backoff_factor and growth_interval are for "
                "loss_scale: dynamic");
  }
  Require(std::isfinite(so.init_scale) && so.init_scale > 0, pr, "init_scale",
          "must be positive and finite");
  Require(so.growth_factor > 1 && std::isfinite(so.growth_factor), pr, "growth_factor",
          "must be > 1");
  Require(so.backoff_factor > 0 && so.backoff_factor < 1, pr, "backoff_factor",
          "must be in (0, 1)");
  Require(so.growth_interval >= 1, pr, "growth_interval", "must be >= 1");
}

PrecisionConfig ParsePrecision(const YamlSection& pr) {
  PrecisionConfig p;
  const std::string compute = pr.String("compute", "fp32");
  Require(compute == "fp32" || compute == "fp64" || compute == "bf16" || compute == "fp16", pr,
          "compute", "must be fp32, fp64, bf16 or fp16, got '" + compute + "'");
  p.compute = compute == "fp64"   ? DType::kF64
              : compute == "bf16" ? DType::kBF16
              : compute == "fp16" ? DType::kF16
                                  : DType::kF32;
  ParseLossScale(pr, compute, p);
  return p;
}

constexpr std::string_view kLogKeys[] = {"interval"};

// The root and every section, each checked against its key list: an unknown key anywhere in
// the file stops here, before any value is read.
Sections DeclareSections(const YamlConfig& yaml) {
  YamlSection root = yaml.Root();
  root.Declare(kTopKeys);
  auto declared = [](YamlSection section, std::span<const std::string_view> keys) {
    section.Declare(keys);
    return section;
  };
  // Each Section() call asks the parent about the key, so the parents are copied last.
  YamlSection model = declared(root.Section("model"), kModelKeys);
  YamlSection data = declared(root.Section("data"), kDataKeys);
  YamlSection synthetic = declared(data.Section("synthetic"), kSyntheticKeys);
  YamlSection solver = root.Section("solver");
  solver.Declare(kSolverKeys, OtherSchedulesKeys(solver));
  YamlSection checkpoint = declared(root.Section("checkpoint"), kCheckpointKeys);
  YamlSection distributed = declared(root.Section("distributed"), kDistributedKeys);
  YamlSection precision = declared(root.Section("precision"), kPrecisionKeys);
  YamlSection log = declared(root.Section("log"), kLogKeys);
  return Sections{root, model, data, synthetic, solver, checkpoint, distributed, precision, log};
}

}  // namespace

RunConfig ParseRunConfig(YamlConfig& yaml, bool need_train, bool check_data) {
  const Sections s = DeclareSections(yaml);
  RunConfig c;
  c.file = yaml.file();
  const int64_t seed = s.root.Int("seed", 1);
  Require(seed >= 0, s.root, "seed", "must be >= 0");
  c.seed = static_cast<uint64_t>(seed);
  c.model = ParseModel(yaml, s.model);
  c.data = ParseData(s.data, s.synthetic, need_train, check_data);
  c.solver = ParseSolver(s.solver);
  c.checkpoint = ParseCheckpoint(s.checkpoint, c.file, c.solver.epoch_based);
  c.distributed = ParseDistributed(s.distributed);
  c.precision = ParsePrecision(s.precision);
  if (c.precision.compute == DType::kF64 && c.distributed.codec.codec != "f32") {
    s.distributed.Error("codec",
                        "the gradient codecs compress f32 gradients; precision.compute "
                        "is fp64 (use distributed.codec: f32 with it)");
  }
  c.log_interval = s.log.Int("interval", 50);
  Require(c.log_interval >= 1, s.log, "interval", "must be >= 1");
  for (const YamlSection* section : {&s.model, &s.data, &s.synthetic, &s.solver, &s.checkpoint,
                                     &s.distributed, &s.precision, &s.log, &s.root}) {
    section->Finish();
  }
  c.resolved_yaml = yaml.Resolved();
  return c;
}

}  // namespace cortado
