// Trainer, its checkpoints: the run's own state (position, seed, config, world shape), the
// whole state collected from its parts (net, solver, loss scaler, data-parallel glue: each saves
// and loads its own, engine/io/checkpoint.h's CheckpointState), resuming, initializing from
// weights, and rank 0's starting state sent to the others.
#include <filesystem>

#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/io/safetensors.h"
#include "engine/io/yaml_config.h"
#include "tools/command_line.h"
#include "tools/trainer.h"
#include "tools/weights.h"

namespace cortado {

tools::RunFolder Trainer::RunFolderOf(const TrainOptions& options) const {
  tools::RunFolder folder;
  folder.checkpoint_dir = config_.checkpoint.dir;
  folder.metrics_path = options.metrics_path;
  folder.config_yaml = config_.resolved_yaml;
  folder.overwrite = options.overwrite;
  return folder;
}

void Trainer::SaveState(Checkpoint& ckpt) const {
  ckpt.meta["format"] = "cortado-train";
  ckpt.meta["iteration"] = std::to_string(iteration_);
  ckpt.meta["epoch"] = std::to_string(iteration_ / batches_per_epoch_);
  ckpt.meta["batch_in_epoch"] = std::to_string(iteration_ % batches_per_epoch_);
  ckpt.meta["batches_per_epoch"] = std::to_string(batches_per_epoch_);
  ckpt.meta["seed"] = std::to_string(config_.seed);
  // All randomness during training is counter-based on (seed, epoch, iteration, index), so
  // the generator state is fully described by the seed and the position above.
  ckpt.meta["rng"] = "counter-based(seed, epoch, iteration)";
  ckpt.meta["config"] = config_.resolved_yaml;
  ckpt.meta["config_form"] = "resolved";  // every key with its value, defaults included
  ckpt.meta["config_hash"] = ConfigHash(config_.resolved_yaml);
  ckpt.meta["run_id"] = run_id_;
  ckpt.meta["world_size"] = std::to_string(world_.size);
  ckpt.meta["batch_per_rank"] = std::to_string(config_.data.batch_size);
  ckpt.meta["global_batch"] = std::to_string(global_batch());
}

void Trainer::LoadState(const Checkpoint& ckpt, const std::string& path) {
  const int64_t iteration = ckpt.MetaInt("iteration", path);
  CORTADO_CHECK(iteration >= 0 && iteration <= max_iter_, "checkpoint '", path,
                "' is at iteration ", iteration, ", beyond this run's ", max_iter_);
  if (ckpt.meta.count("global_batch")) {
    // The data order and the schedule follow the global batch, not the rank count.
    const int64_t saved = ckpt.MetaInt("global_batch", path);
    if (saved != global_batch()) {
      const int64_t ranks = ckpt.MetaInt("world_size", path);
      std::string fix = saved % world_.size == 0
                            ? StrCat("resume with --set data.batch_size=", saved / world_.size,
                                     " on ", world_.size, " rank(s)")
                            : StrCat("no per-rank batch gives ", saved, " on ", world_.size,
                                     " rank(s); resume on a rank count that divides it");
      Fail("checkpoint '", path, "' was written with a global batch of ", saved, " (", ranks,
           " rank(s) x ", ckpt.MetaInt("batch_per_rank", path), "), this run's is ", global_batch(),
           " (", world_.size, " x ", config_.data.batch_size, "); ", fix,
           ", or start a new run in another checkpoint.dir");
    }
  }
  const int64_t saved_bpe = ckpt.MetaInt("batches_per_epoch", path);
  CORTADO_CHECK(saved_bpe == batches_per_epoch_, "checkpoint '", path, "' was written with ",
                saved_bpe, " batches per epoch, this run has ", batches_per_epoch_,
                " (batch size or data changed)");
  iteration_ = iteration;
  // Checkpoints written before runs had ids: the continuation is a run of its own.
  auto id = ckpt.meta.find("run_id");
  run_id_ = id != ckpt.meta.end() && !id->second.empty() ? id->second : tools::NewRunId();
}

void Trainer::Start(const std::string& resume, const tools::RunFolder* folder) {
  if (world_.size == 1) return StartHere(resume, folder);
  // Rank 0 resumes (or keeps its fresh initialization) and sends its whole state.
  Checkpoint state = BroadcastState(*world_.comm, [&] {
    StartHere(resume, folder);
    return CollectState();
  });
  if (!is_root()) LoadAllState(state, "rank 0's state");
}

void Trainer::StartHere(const std::string& resume, const tools::RunFolder* folder) {
  const bool resumed = !resume.empty() && Resume(resume);
  if (!resumed && !config_.model.weights.empty()) InitFromWeights();
  if (folder) tools::CheckRunFolder(*folder, !resume.empty(), run_id_);
}

std::string Trainer::SaveCheckpointNow() {
  if (dp_) dp_->GatherForCheckpoint();
  saved_at_ = iteration_;
  if (!is_root()) return "";
  saved_path_ =
      (std::filesystem::path(config_.checkpoint.dir) / CheckpointFileName(iteration_)).string();
  SaveCheckpoint(CollectState(), saved_path_);
  PruneCheckpoints(config_.checkpoint.dir, config_.checkpoint.keep, run_id_);
  return saved_path_;
}

Checkpoint Trainer::CollectState() const {
  Checkpoint ckpt;
  SaveState(ckpt);
  net_->SaveState(ckpt);
  solver_->SaveState(ckpt);
  if (scaler_) scaler_->SaveState(ckpt);
  if (dp_) dp_->SaveState(ckpt);
  return ckpt;
}

void Trainer::LoadAllState(const Checkpoint& ckpt, const std::string& path) {
  net_->LoadState(ckpt, path);
  solver_->LoadState(ckpt, path);
  if (scaler_) scaler_->LoadState(ckpt, path);
  LoadState(ckpt, path);
  if (dp_) {
    dp_->LoadState(ckpt, path);
  } else if (ckpt.meta.count("error_feedback_ranks")) {
    LogWarning(ErrorFeedbackDropped(path));
  }
}

bool Trainer::Resume(const std::string& what) {
  std::string path = what;
  Checkpoint ckpt;
  if (what == "auto") {
    path = NewestLoadableCheckpoint(config_.checkpoint.dir, &ckpt);
    if (path.empty()) {
      LogInfo("no checkpoint in '", config_.checkpoint.dir, "'; starting fresh");
      return false;
    }
  } else {
    tools::CheckInputFile("--resume", path, "a checkpoint file (ckpt-*.cortado), or 'auto'");
    ckpt = LoadCheckpoint(path);
  }
  LoadAllState(ckpt, path);
  LogInfo("resumed from '", path, "' at iteration ", iteration_, " (epoch ",
          iteration_ / batches_per_epoch_, ")");
  WarnAboutConfigChanges(ckpt, path);
  if (!config_.model.weights.empty()) {
    LogInfo("model.weights '", config_.model.weights,
            "' is not loaded: the checkpoint's weights continue the run");
  }
  return true;
}

void Trainer::InitFromWeights() {
  const std::string& path = config_.model.weights;
  const Safetensors file = LoadSafetensors(path);
  const std::string other_builder = tools::BuilderWarning(file, config_.model.builder, path);
  if (!other_builder.empty()) LogWarning(other_builder);
  const tools::WeightsReport report =
      tools::LoadWeights(*net_, config_.model.builder, file, path, /*strict=*/false);
  tools::CheckFineTuning(report, path, config_.model.weights_partial);
  LogInfo(report.Summary(path));
}

// A resumed run may change its config on purpose (a longer schedule, a lower rate), but never
// without saying so.
void Trainer::WarnAboutConfigChanges(const Checkpoint& ckpt, const std::string& path) const {
  auto stored = ckpt.meta.find("config");
  if (stored == ckpt.meta.end() || stored->second == config_.resolved_yaml) return;
  std::vector<std::string> changes;
  try {
    changes = YamlDifferences(stored->second, config_.resolved_yaml);
  } catch (const Error& e) {
    LogWarning("checkpoint '", path, "': cannot compare its stored config: ", e.what());
    return;
  }
  if (!ckpt.meta.count("config_form")) {
    // An older checkpoint stored the config as written: a key it lacks had the default of its
    // time, which cannot be known, so only keys it wrote are compared.
    std::erase_if(changes, [](const std::string& c) { return c.find(": (unset) -> ") != c.npos; });
  }
  if (changes.empty()) return;
  std::string list;
  for (size_t i = 0; i < changes.size() && i < 8; ++i) list += (i ? "; " : "") + changes[i];
  if (changes.size() > 8) list += StrCat("; and ", changes.size() - 8, " more");
  LogWarning("resuming with a config that differs from the one '", path, "' was written with (",
             changes.size(), " key(s), config hash ",
             ckpt.meta.count("config_hash") ? ckpt.meta.at("config_hash") : "?", " -> ",
             ConfigHash(config_.resolved_yaml), "): ", list);
}

}  // namespace cortado
