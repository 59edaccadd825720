// `cortado eval --checkpoint PATH|auto [--config F] [--set k=v]... [--json] [--threads N]
// [--no-progress]`:
// evaluates a checkpoint on the validation data; `--weights F.safetensors --config F` a
// weights file (cortado export, or torchvision's names), strictly: every tensor must fit. Without
// --config the config stored in the checkpoint (the resolved YAML of the run that wrote it) is
// used, and --set overrides it (a data.val path on another machine); --config replaces it.
// `--checkpoint auto` takes the newest loadable checkpoint in the config's checkpoint.dir, so it
// needs --config. Under `cortado launch`, mpirun or srun the ranks split the validation set and
// rank 0 prints the totals. The net is built for inference (engine/graph/net.h: no gradients, no
// solver state, each activation's buffer reused once the next layer has read it).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/class_names.h"
#include "engine/base/log.h"
#include "engine/base/thread_pool.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/detection_eval.h"
#include "tools/file_kind.h"
#include "tools/metrics.h"
#include "tools/trainer.h"
#include "tools/weights.h"
#include "tools/world.h"

namespace cortado::tools {
namespace {

struct EvalArgs {
  std::string config, checkpoint, weights, device;
  std::string detections;  // a detector's COCO results file; "" none
  std::vector<std::string> sets;
  bool json = false;
  bool no_progress = false;
  int threads = 0;
};

// Usage errors (exit 2) come first, before any file is read.
void CheckEvalFlags(const EvalArgs& a) {
  if (!a.checkpoint.empty() && !a.weights.empty()) {
    UsageFail("give --checkpoint or --weights, not both: a checkpoint holds its own weights");
  }
  if (a.checkpoint.empty() && a.weights.empty()) {
    UsageFail("give --checkpoint (a checkpoint, or auto) or --weights (a safetensors file)");
  }
  if (!a.weights.empty() && a.config.empty()) {
    UsageFail("--weights needs --config: a weights file holds no model or data settings");
  }
  if (a.checkpoint == "auto" && a.config.empty()) {
    UsageFail("--checkpoint auto needs --config, whose checkpoint.dir it searches");
  }
  if (!a.detections.empty() && std::filesystem::is_directory(a.detections)) {
    UsageFail("--detections '" + a.detections + "' is a folder; give the results file to write");
  }
}

// What is evaluated: the config, and the checkpoint with its path unless --weights is given.
struct EvalInputs {
  RunConfig config;
  Checkpoint ckpt;
  std::string ckpt_path;
};

// The config stored in the checkpoint (the resolved YAML of the run that wrote it), with --set.
RunConfig StoredConfig(const Checkpoint& ckpt, const std::string& ckpt_path,
                       const std::vector<std::string>& sets) {
  auto stored = ckpt.meta.find("config");
  CORTADO_CHECK(stored != ckpt.meta.end(), "checkpoint '", ckpt_path,
                "' holds no config; give --config");
  YamlConfig yaml = YamlConfig::FromString(stored->second, ckpt_path + " (stored config)");
  for (const std::string& o : sets) yaml.Set(o);
  return ParseRunConfig(yaml, /*need_train=*/false);
}

EvalInputs LoadEvalInputs(const EvalArgs& a) {
  EvalInputs in;
  in.ckpt_path = a.checkpoint;
  if (!a.weights.empty()) {
    CheckInputFile("--weights", a.weights, "a safetensors file (cortado export)");
    ExpectSafetensors("--weights", a.weights);
    in.config = LoadRunConfig(a.config, a.sets, /*need_train=*/false);
  } else if (in.ckpt_path == "auto") {
    in.config = LoadRunConfig(a.config, a.sets, /*need_train=*/false);
    in.ckpt_path = NewestLoadableCheckpoint(in.config.checkpoint.dir, &in.ckpt, Net::IsNetState);
    CORTADO_CHECK(!in.ckpt_path.empty(), "--checkpoint auto: no valid checkpoint in '",
                  in.config.checkpoint.dir, "' (checkpoint.dir of ", a.config, ")");
  } else {
    CheckInputFile("--checkpoint", in.ckpt_path, "a checkpoint file (ckpt-*.cortado)");
    ExpectCheckpoint("--checkpoint", in.ckpt_path,
                     "evaluate it with --weights " + in.ckpt_path + " --config F");
    in.ckpt = LoadCheckpoint(in.ckpt_path, Net::IsNetState);  // no solver state
    in.config = a.config.empty() ? StoredConfig(in.ckpt, in.ckpt_path, a.sets)
                                 : LoadRunConfig(a.config, a.sets, /*need_train=*/false);
  }
  CORTADO_CHECK(HasValidation(in.config.data), in.config.file,
                in.config.data.type == "synthetic"
                    ? ": data.synthetic.val_samples is 0; there is nothing to evaluate on "
                      "(--set data.synthetic.val_samples=N)"
                    : ": data.val is not set; there is nothing to evaluate on "
                      "(--set data.val=PATH)");
  return in;
}

// An inference net: the checkpoint's weights and batch-norm statistics load without any
// gradient or solver state, and activations go back to the pool once read.
std::unique_ptr<Net> MakeEvalNet(const EvalArgs& a, EvalInputs& in, const BatchSource& val) {
  const RunConfig& config = in.config;
  int64_t batch =
      config.data.val_batch_size > 0 ? config.data.val_batch_size : config.data.batch_size;
  NetSpec spec = MakeNetSpec(config, val.sample_shape(), val.num_classes(), batch);
  auto net = std::make_unique<Net>(spec, config.seed, config.precision.compute,
                                   ConfigNetOptions(config, NetMode::kInference));
  if (a.weights.empty()) {
    net->LoadState(in.ckpt, in.ckpt_path);
    in.ckpt.tensors = {};  // the net holds its own copy: not the weights twice while evaluating
  } else {
    LoadWeights(*net, config.model.builder, LoadSafetensors(a.weights), a.weights,
                /*strict=*/true);
  }
  return net;
}

// The validation database's class names without the background (classes.txt, else the label
// map's display names), for the per-class figures; empty when it names none.
std::vector<std::string> DetectionClassNames(const RunConfig& config) {
  std::vector<std::string> names;
  std::optional<std::vector<std::string>> listed = ReadClassNames(config.data.val);
  if (listed && listed->size() > 1) names.assign(listed->begin() + 1, listed->end());
  return names;
}

// A detector's report: one JSON object (MetricsJson's keys, the loss), or the means and a table
// of the classes.
void ReportDetection(const EvalArgs& a, const EvalInputs& in, const EvalResult& r,
                     const std::string& source, const std::string& skipped) {
  const std::vector<std::string> names = DetectionClassNames(in.config);
  if (a.json) {
    nlohmann::ordered_json j = detection::MetricsJson(r.metrics, /*voc07=*/true, names);
    j["loss"] = r.loss;
    j["skipped"] = r.skipped;
    if (!a.detections.empty()) j["detections_file"] = a.detections;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  auto percent = [](double v) {
    return std::isnan(v) ? std::string("   -  ") : StrCat(Fixed(v * 100, 2), "%");
  };
  const detection::DetectionMetrics& m = r.metrics;
  std::printf("%-16s %9s %9s %9s %7s %10s\n", "class", "AP50 11pt", "AP50 area", "AP", "boxes",
              "detections");
  for (int c = 1; c <= m.num_classes; ++c) {
    const size_t i = static_cast<size_t>(c - 1);
    const std::string name = i < names.size() ? names[i] : std::to_string(c);
    std::printf("%-16s %9s %9s %9s %7lld %10lld\n", name.c_str(), percent(m.voc07_ap[i]).c_str(),
                percent(m.voc_ap[i]).c_str(), percent(m.coco_ap[i]).c_str(),
                static_cast<long long>(m.positives[i]), static_cast<long long>(m.detections[i]));
  }
  std::printf(
      "mAP@0.5 %s (VOC07 11-point; area %s)  mAP@[.5:.95] %s  loss %.4f  (%lld images, %s%s)\n",
      percent(m.voc07_map).c_str(), percent(m.voc_map).c_str(), percent(m.coco_map).c_str(), r.loss,
      static_cast<long long>(r.images), skipped.c_str(), source.c_str());
  if (!a.detections.empty()) std::printf("detections written to %s\n", a.detections.c_str());
}

// Rank 0's report: the warnings, then one JSON object or one line naming what was evaluated.
void ReportEval(const EvalArgs& a, const EvalInputs& in, const EvalResult& r,
                const std::string& classes_warning) {
  if (!classes_warning.empty()) LogWarning(classes_warning);
  if (r.skipped > 0) {
    LogWarning(r.skipped, " unreadable record(s) of ", in.config.data.val,
               " were left out of the evaluation (the first are named above)");
  }
  const std::string source =
      a.weights.empty() ? "checkpoint " + in.ckpt_path : "weights " + a.weights;
  const std::string skipped =
      r.skipped > 0 ? StrCat(r.skipped, " unreadable record(s) skipped, ") : std::string();
  if (r.detection) return ReportDetection(a, in, r, source, skipped);
  if (a.json) {
    nlohmann::ordered_json j;
    j["top1"] = r.top1;
    j["top5"] = r.top5;
    j["loss"] = r.loss;
    j["images"] = r.images;
    j["skipped"] = r.skipped;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("top1 %.2f%%  top5 %.2f%%  loss %.4f  (%lld images, %s%s)\n", r.top1 * 100,
              r.top5 * 100, r.loss, static_cast<long long>(r.images), skipped.c_str(),
              source.c_str());
}

void RunEval(EvalArgs a) {
  CheckEvalFlags(a);
  if (!a.device.empty()) {
    a.sets.push_back("device=" + a.device);
  } else if (a.config.empty()) {
    // The checkpoint's stored config names the device it trained on; evaluating it elsewhere
    // (a checkpoint is device-independent) takes the CPU unless --device says otherwise.
    a.sets.push_back("device=cpu");
  }
  EvalInputs in = LoadEvalInputs(a);
  const std::string classes_warning = CheckClassNames(in.config.data);
  World world = JoinWorld(in.config.distributed);
  JoinAsRank(world);
  ApplyThreadBudget(a.threads, world.local_size);
  in.config.data.channels_last = ConfigLayout(in.config) == MemoryFormat::kNHWC;  // the net's
  std::unique_ptr<BatchSource> val =
      MakeEvalSource(in.config.data, ShardSpec{world.rank, world.size});
  std::unique_ptr<Net> net = MakeEvalNet(a, in, *val);
  EvalControl control;
  if (a.no_progress) control.progress_seconds = 0;  // no "eval  batch" lines
  detection::CocoResults results;
  if (!a.detections.empty()) control.results = &results;
  EvalResult r = Evaluate(*net, *val, world.comm.get(), control);
  CORTADO_CHECK(r.images > 0, "no record of ", in.config.data.val,
                " could be read; there is nothing to evaluate");
  CORTADO_CHECK(a.detections.empty() || r.detection, "--detections ", a.detections,
                ": the model of ", in.config.file,
                " is not a detector (it has no DetectionOutput layer)");
  if (!a.detections.empty() && world.rank == 0) results.Write(a.detections);
  if (world.rank == 0) ReportEval(a, in, r, classes_warning);
}

}  // namespace

void AddEvalCommand(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Evaluate a checkpoint (or a weights file) on the validation data");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint file, or 'auto': the newest valid one in the config's "
                  "checkpoint.dir (needs --config)");
  cmd->add_option("--weights", args->weights,
                  "Evaluate a safetensors weights file instead (needs --config for the model and "
                  "data; every tensor must match the model)");
  cmd->add_option("--config", args->config,
                  "YAML config file (default: the config stored in the checkpoint)");
  cmd->add_option("--set", args->sets,
                  "Override a config key, e.g. --set data.val=PATH (applies to either config)");
  cmd->add_option("--device", args->device,
                  "Where to evaluate: cpu, test[:N] (the guarded host-memory test device) or "
                  "cuda[:N]. Same as --set device=...");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_option("--detections", args->detections,
                  "Detection: write every detection as COCO results JSON to this file "
                  "(replaced atomically; image_id is the record's index in the database)");
  cmd->add_option("--threads", args->threads,
                  "Thread budget per rank (0: CORTADO_NUM_THREADS, else the cores divided among "
                  "the ranks on this machine)")
      ->check(IntAtLeast(0, "0: the default budget"));
  cmd->add_flag("--no-progress", args->no_progress,
                "No progress lines (by default a pass longer than 5 s logs where it stands "
                "every 5 s)");
  cmd->callback([args] {
    RunEval(*args);
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
