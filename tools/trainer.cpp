#include "tools/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "data/class_names.h"
#include "data/lmdb_source.h"
#include "engine/error.h"
#include "engine/gemm_lowp.h"
#include "engine/log.h"
#include "engine/safetensors.h"
#include "engine/thread_pool.h"
#include "engine/yaml_config.h"
#include "models/builders.h"
#include "tools/command_line.h"
#include "tools/weights.h"

namespace cortado {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double BlobValue(Net& net, const std::string& name) {
  if (!net.has_blob(name)) return NAN;
  return ElementAsDouble(net.blob(name)->data, 0);
}

std::string Bytes(double bytes) {
  return bytes < 1048576.0 ? Fixed(bytes / 1024.0, 0) + " KB" : Fixed(bytes / 1048576.0, 1) + " MB";
}

}  // namespace

void FeedBatch(Net& net, const Batch& batch) {
  CORTADO_CHECK(batch.images.dtype() == DType::kF32 && batch.labels.dtype() == DType::kI32,
                "data source produced ", batch.images.ToString(), " images and ",
                batch.labels.ToString(), " labels (want f32 and i32)");
  Tensor& data = net.input("data");
  CORTADO_CHECK(
      batch.images.ndim() == 4 && data.ndim() == 4 && batch.images.dim(1) == data.dim(1) &&
          batch.images.dim(2) == data.dim(2) && batch.images.dim(3) == data.dim(3),
      "data source produced images ", batch.images.ToString(), " but the net expects [N, ",
      data.dim(1), ", ", data.dim(2), ", ", data.dim(3), "]");
  if (data.dtype() == DType::kF32) {
    data = batch.images;
  } else {
    // An f64 net (precision.compute: fp64) gets a converted copy in its own input tensor.
    data.Resize(batch.images.shape(), data.dtype());
    data.ConvertFrom(batch.images);
  }
  net.input("label") = batch.labels;
}

NetSpec MakeNetSpec(const RunConfig& config, const Shape& sample_shape, int64_t num_classes,
                    int64_t batch_size) {
  CORTADO_CHECK(sample_shape.size() == 3, "data samples must be [C, H, W], got ",
                ShapeString(sample_shape));
  ModelOptions o;
  o.num_classes = config.model.num_classes > 0 ? config.model.num_classes : num_classes;
  CORTADO_CHECK(o.num_classes >= 1,
                "model.num_classes is not set and the data does not say "
                "how many classes it has");
  CORTADO_CHECK(num_classes <= 0 || o.num_classes >= num_classes, "model.num_classes is ",
                o.num_classes, " but the data has labels up to ", num_classes - 1);
  o.in_channels = sample_shape[0];
  CORTADO_CHECK(config.model.in_channels == 0 || config.model.in_channels == sample_shape[0],
                "model.in_channels is ", config.model.in_channels, " but the data has ",
                sample_shape[0], " channel(s)");
  o.height = sample_shape[1];
  o.width = sample_shape[2];
  o.batch_size = batch_size;
  o.label_smoothing = config.model.label_smoothing;
  o.zero_init_residual = config.model.zero_init_residual;
  o.base_width = config.model.base_width;
  if (!config.model.builder.empty()) return BuildModel(config.model.builder, o);
  NetSpec spec;
  spec.name = "graph";
  spec.inputs = ImageInputs(o);
  spec.layers = config.model.layers;
  return spec;
}

EvalResult Evaluate(Net& net, BatchSource& source, dist::Communicator* comm) {
  Phase previous = net.phase();
  net.set_phase(Phase::kTest);
  // Sums: correct top-1 and top-5 images (whole numbers: the accuracy layers give fractions of
  // the batch), loss times images, images, records skipped.
  double sums[5] = {0, 0, 0, 0, 0};
  Batch batch;
  const int64_t skipped_before = source.stats().skipped_records;
  source.Start(0, 0);
  while (source.Next(batch)) {
    if (batch.size == 0) continue;  // every record of the batch was unreadable
    FeedBatch(net, batch);
    const double loss = net.Forward();
    const double n = static_cast<double>(batch.size);
    sums[0] += std::round(BlobValue(net, "top1") * n);
    sums[1] += std::round(BlobValue(net, "top5") * n);
    sums[2] += loss * n;
    sums[3] += n;
  }
  sums[4] = static_cast<double>(source.stats().skipped_records - skipped_before);
  net.set_phase(previous);
  if (comm != nullptr && comm->size() > 1) {
    comm->AllReduce(sums, 5, dist::DataType::kF64, dist::ReduceOp::kSum);
  }
  EvalResult r;
  r.images = static_cast<int64_t>(sums[3]);
  r.skipped = static_cast<int64_t>(sums[4]);
  if (r.images > 0) {
    r.top1 = sums[0] / sums[3];
    r.top5 = sums[1] / sums[3];
    r.loss = sums[2] / sums[3];
  }
  return r;
}

std::string NetTable(Net& net) {
  std::vector<std::array<std::string, 4>> rows = {{"layer", "type", "output", "params"}};
  for (const auto& layer : net.layers()) {
    int64_t n = 0;
    for (const Param& p : layer->params()) n += p.value.numel();
    const std::vector<std::string>& outs = layer->spec().outputs;
    const std::string shape = !outs.empty() && net.has_blob(outs[0])
                                  ? ShapeString(net.blob(outs[0])->data.shape())
                                  : std::string("-");
    rows.push_back({layer->name(), layer->type(), shape, std::to_string(n)});
  }
  // Each column as wide as its longest entry plus two spaces: a long layer name never runs
  // into its type.
  size_t width[3] = {0, 0, 0};
  for (const auto& r : rows) {
    for (int c = 0; c < 3; ++c) width[c] = std::max(width[c], r[static_cast<size_t>(c)].size());
  }
  std::ostringstream out;
  for (const auto& r : rows) {
    for (int c = 0; c < 3; ++c) {
      out << r[static_cast<size_t>(c)]
          << std::string(width[c] + 2 - r[static_cast<size_t>(c)].size(), ' ');
    }
    out << r[3] << "\n";
  }
  out << "total parameters: " << net.num_parameters() << "\n";
  return out.str();
}

std::string NetTableWithoutData(const RunConfig& config) {
  const DataOptions& d = config.data;
  CORTADO_CHECK(d.type != "idx", "the input size of an IDX net comes from its files");
  CORTADO_CHECK(config.model.num_classes > 0 || d.type == "synthetic",
                "model.num_classes is not set, and only the data could say how many classes");
  const Shape sample = d.type == "synthetic"
                           ? Shape(d.synthetic_shape.begin(), d.synthetic_shape.end())
                           : LmdbSampleShape(d);
  const int64_t classes = d.type == "synthetic" ? d.synthetic_classes : -1;
  Net net(MakeNetSpec(config, sample, classes, d.batch_size), config.seed,
          config.precision.compute);
  return StrCat(NetTable(net), "(built from the config alone: ",
                config.model.num_classes > 0 ? config.model.num_classes : classes,
                " classes, input ", ShapeString(sample), ")\n");
}

namespace {
// Records at `path` of the config's data type: the size of one evaluation pass over it, which
// neither drops nor pads.
int64_t RecordCount(const DataOptions& options, const std::string& path) {
  DataOptions o = options;
  o.val = path;
  o.val_batch_size = o.batch_size;
  return MakeEvalSource(o, ShardSpec{})->samples_per_epoch();
}
}  // namespace

std::string DataSummary(const RunConfig& config, const BatchSource& train) {
  const DataOptions& d = config.data;
  std::ostringstream out;
  const int64_t per_epoch = train.samples_per_epoch();
  const int64_t batches = train.batches_per_epoch();
  if (d.type == "synthetic") {
    out << "data: synthetic, " << d.synthetic_samples << " samples of "
        << ShapeString(train.sample_shape()) << "; an epoch is " << batches << " batches of "
        << d.batch_size << " = " << per_epoch << " samples; "
        << (d.synthetic_val_samples > 0
                ? StrCat(d.synthetic_val_samples, " samples evaluated")
                : std::string("no evaluation (data.synthetic.val_samples: 0)"))
        << "\n";
    return out.str();
  }
  const int64_t records = RecordCount(d, d.train);
  out << "data.train: " << records << " records (" << d.type << ", " << d.train << "), samples "
      << ShapeString(train.sample_shape());
  if (train.num_classes() > 0) out << ", " << train.num_classes() << " classes";
  out << "; an epoch is " << batches << " batches of " << d.batch_size << " = " << per_epoch
      << " samples";
  if (per_epoch < records) {
    out << " (drop_last leaves " << records - per_epoch << " records out of each shuffled epoch)";
  } else if (per_epoch > records) {
    out << " (padded by wrapping: " << per_epoch - records << " records twice)";
  }
  out << "\n";
  if (!d.val.empty()) {
    const int64_t val_batch = d.val_batch_size > 0 ? d.val_batch_size : d.batch_size;
    out << "data.val: " << RecordCount(d, d.val) << " records (" << d.val
        << "), evaluated in batches of " << val_batch << "\n";
  } else {
    out << "data.val: none (no evaluation)\n";
  }
  return out.str();
}

Trainer::Trainer(RunConfig config, World world)
    : config_(std::move(config)), world_(std::move(world)), run_id_(tools::NewRunId()) {
  const uint64_t seed = config_.seed;
  const ShardSpec shard{world_.rank, world_.size};
  train_source_ = MakeTrainSource(config_.data, shard, seed);
  if (HasValidation(config_.data)) {
    val_source_ = MakeEvalSource(config_.data, shard);
  }
  const std::string classes_warning = CheckClassNames(config_.data);
  if (!classes_warning.empty() && world_.rank == 0) LogWarning(classes_warning);
  NetSpec spec = MakeNetSpec(config_, train_source_->sample_shape(), train_source_->num_classes(),
                             config_.data.batch_size);
  // Activations follow the net's memory plan: each goes back to the pool after the last
  // backward that reads it (engine/memory_plan.h).
  NetOptions net_options;
  net_options.plan_memory = true;
  net_ = std::make_unique<Net>(spec, seed, config_.precision.compute, net_options);
  solver_ = std::make_unique<SgdSolver>(net_->params(), config_.solver.sgd);
  if (config_.precision.loss_scaling) {
    scaler_ = std::make_unique<LossScaler>(config_.precision.scaler);
  }
  schedule_ = std::make_unique<LrSchedule>(config_.solver.schedule);
  batches_per_epoch_ = train_source_->batches_per_epoch();
  max_iter_ = config_.solver.epoch_based ? config_.solver.max_epochs * batches_per_epoch_
                                         : config_.solver.max_iter;
  if (world_.size == 1) return;

  CORTADO_CHECK(world_.comm != nullptr, "a ", world_.size, "-rank job without a communicator");
  // Sample j of this rank is sample rank + j * W of the global batch (EpochSharder).
  net_->context().sample_base = world_.rank;
  net_->context().sample_stride = world_.size;
  const DistributedConfig& d = config_.distributed;
  const int group = d.sync_bn_group == 0 ? world_.size : d.sync_bn_group;
  CORTADO_CHECK(world_.size % group == 0, "distributed.sync_bn_group is ", group,
                ", which does not divide the world size ", world_.size,
                " (groups are consecutive ranks; use a divisor, or 0 for all ranks)");
  // Batch-norm statistics get a communicator of their own, so that a layer's all-reduce inside
  // backward never queues behind the gradient buckets on the job's communicator. Split is
  // collective: every rank makes it, even where groups are of one.
  std::unique_ptr<dist::Communicator> bn_comm =
      world_.comm->Split(world_.rank / group, world_.rank);
  if (group > 1) {
    sync_bn_ = std::make_unique<SyncBatchNormReducer>(std::move(bn_comm));
    net_->context().batch_stats = sync_bn_.get();
    net_->context().sync_batch_norm = d.sync_bn;
  }
  DataParallelOptions options;
  options.bucket_mb = d.bucket_mb;
  options.first_bucket_mb = d.first_bucket_mb;
  options.last_bucket_mb = d.last_bucket_mb;
  options.overlap = d.overlap;
  options.rounding = d.rounding;
  options.error_feedback = d.error_feedback;
  options.seed = config_.seed;
  options.auto_codec = d.auto_codec;
  if (options.auto_codec.enabled) options.auto_codec.link_override = AutoLinkFromEnv();
  ApplyCodecPolicy(*net_, d.codec);
  dp_ = std::make_unique<DataParallel>(*net_, *world_.comm, options);
  dp_->VerifySameJob(JobDescription());
}

Trainer::~Trainer() = default;

std::string Trainer::JobDescription() const {
  std::ostringstream out;
  // One key path per line, so a difference names its key ("solver.base_lr: 0.05").
  for (const auto& [key, value] : FlattenYaml(config_.resolved_yaml, "the resolved config")) {
    out << "config: " << key << ": " << value << "\n";
  }
  for (Param* p : net_->params()) out << "model: " << p->name << " " << p->value.ToString() << "\n";
  for (Buffer* b : net_->buffers())
    out << "model: " << b->name << " " << b->value.ToString() << "\n";
  out << "data: " << batches_per_epoch_ << " batches per epoch of samples "
      << ShapeString(train_source_->sample_shape()) << ", " << train_source_->num_classes()
      << " classes\n";
  return out.str();
}

double Trainer::Progress(int64_t iteration) const {
  return config_.solver.epoch_based ? static_cast<double>(iteration) / batches_per_epoch_
                                    : static_cast<double>(iteration);
}

bool Trainer::Crossed(double interval, int64_t iteration) const {
  if (interval <= 0) return false;
  // True when [iteration-1, iteration] crosses a multiple of interval (in schedule units).
  double a = Progress(iteration - 1) / interval, b = Progress(iteration) / interval;
  return std::floor(b + 1e-9) > std::floor(a + 1e-9);
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
  const int64_t iteration = ckpt.MetaInt("iteration");
  CORTADO_CHECK(iteration >= 0 && iteration <= max_iter_, "checkpoint '", path,
                "' is at iteration ", iteration, ", beyond this run's ", max_iter_);
  if (ckpt.meta.count("global_batch")) {
    // The data order and the schedule follow the global batch, not the rank count.
    const int64_t saved = ckpt.MetaInt("global_batch");
    if (saved != global_batch()) {
      const int64_t ranks = ckpt.MetaInt("world_size");
      std::string fix = saved % world_.size == 0
                            ? StrCat("resume with --set data.batch_size=", saved / world_.size,
                                     " on ", world_.size, " rank(s)")
                            : StrCat("no per-rank batch gives ", saved, " on ", world_.size,
                                     " rank(s); resume on a rank count that divides it");
      Fail("checkpoint '", path, "' was written with a global batch of ", saved, " (", ranks,
           " rank(s) x ", ckpt.MetaInt("batch_per_rank"), "), this run's is ", global_batch(), " (",
           world_.size, " x ", config_.data.batch_size, "); ", fix,
           ", or start a new run in another checkpoint.dir");
    }
  }
  const int64_t saved_bpe = ckpt.MetaInt("batches_per_epoch");
  CORTADO_CHECK(saved_bpe == batches_per_epoch_, "checkpoint '", path, "' was written with ",
                saved_bpe, " batches per epoch, this run has ", batches_per_epoch_,
                " (batch size or data changed)");
  iteration_ = iteration;
  // Checkpoints written before runs had ids: the continuation is a run of its own.
  auto id = ckpt.meta.find("run_id");
  run_id_ = id != ckpt.meta.end() && !id->second.empty() ? id->second : tools::NewRunId();
}

Checkpoint Trainer::CollectState() const {
  Checkpoint ckpt;
  SaveState(ckpt);
  net_->SaveState(ckpt);
  solver_->SaveState(ckpt);
  if (scaler_) scaler_->SaveState(ckpt);
  if (dp_) dp_->SaveState(ckpt);
  if (!feedback_.empty()) {
    ckpt.meta["error_feedback_ranks"] = std::to_string(feedback_.size());
    for (size_t r = 0; r < feedback_.size(); ++r) {
      ckpt.Add(StrCat("error_feedback/rank", r), feedback_[r]);
    }
  }
  return ckpt;
}

void Trainer::LoadAllState(const Checkpoint& ckpt, const std::string& path) {
  net_->LoadState(ckpt, path);
  solver_->LoadState(ckpt, path);
  if (scaler_) scaler_->LoadState(ckpt, path);
  LoadState(ckpt, path);
  if (dp_) dp_->LoadState(ckpt, path);
  LoadFeedback(ckpt, path);
}

// Each rank takes back its own residual; on another rank count the residuals no longer match
// the ring's encoding sites, so their sum (what the last step lost in all) goes to rank 0.
void Trainer::LoadFeedback(const Checkpoint& ckpt, const std::string& path) {
  feedback_.clear();
  if (!ckpt.meta.count("error_feedback_ranks")) return;
  const int64_t ranks = ckpt.MetaInt("error_feedback_ranks");
  for (int64_t r = 0; r < ranks; ++r) {
    const Tensor* t = ckpt.Find(StrCat("error_feedback/rank", r));
    CORTADO_CHECK(t != nullptr, "checkpoint '", path, "' lacks error_feedback/rank", r);
    feedback_.push_back(*t);
  }
  if (!dp_ || !dp_->options().error_feedback) {
    if (is_root()) {
      LogWarning("checkpoint '", path, "' holds error-feedback residuals, but this run has ",
                 "distributed.error_feedback off: they are dropped");
    }
    feedback_.clear();
    return;
  }
  if (ranks == world_.size) {
    dp_->SetResidual(feedback_[static_cast<size_t>(world_.rank)]);
    return;
  }
  Tensor sum = feedback_[0].Clone();
  for (size_t r = 1; r < feedback_.size(); ++r) {
    CORTADO_CHECK(feedback_[r].numel() == sum.numel(), "checkpoint '", path,
                  "': error-feedback residuals of different sizes");
    for (int64_t i = 0; i < sum.numel(); ++i) sum.data<float>()[i] += feedback_[r].data<float>()[i];
  }
  if (world_.rank != 0) sum.Zero();
  dp_->SetResidual(sum);
  if (is_root()) {
    LogWarning("checkpoint '", path, "' holds error-feedback residuals of ", ranks,
               " rank(s); this run has ", world_.size, ": their sum goes to rank 0 (the run ",
               "continues, but not bitwise as it would on ", ranks, ")");
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

void Trainer::Start(const std::string& resume, const tools::RunFolder* folder) {
  if (world_.size == 1) {
    const bool resumed = !resume.empty() && Resume(resume);
    if (!resumed && !config_.model.weights.empty()) InitFromWeights();
    if (folder) tools::CheckRunFolder(*folder, !resume.empty(), run_id_);
    return;
  }
  // Rank 0 resumes (or keeps its fresh initialization) and sends its whole state; a failure
  // there reaches every rank as the same error instead of a lost connection.
  std::string blob;
  if (is_root()) {
    try {
      const bool resumed = !resume.empty() && Resume(resume);
      if (!resumed && !config_.model.weights.empty()) InitFromWeights();
      if (folder) tools::CheckRunFolder(*folder, !resume.empty(), run_id_);
      blob = "S" + SerializeCheckpoint(CollectState());
    } catch (const Error& e) {
      blob = std::string("E") + e.what();
    }
  }
  BroadcastBytes(*world_.comm, &blob);
  CORTADO_CHECK(!blob.empty(), "rank 0 sent no starting state");
  if (blob[0] == 'E') Fail(blob.substr(1));
  if (!is_root()) LoadAllState(ParseCheckpoint(blob.substr(1), "rank 0's state"), "rank 0's state");
}

std::string Trainer::SaveCheckpointNow() {
  if (dp_ && dp_->options().error_feedback) feedback_ = dp_->GatherResiduals();
  if (!is_root()) return "";
  std::string path =
      (std::filesystem::path(config_.checkpoint.dir) / CheckpointFileName(iteration_)).string();
  SaveCheckpoint(CollectState(), path);
  PruneCheckpoints(config_.checkpoint.dir, config_.checkpoint.keep, run_id_);
  return path;
}

StepTimes Trainer::Step(const std::atomic<bool>* stop) {
  StepTimes times;
  const auto t0 = Clock::now();
  train_source_->Next(batch_);
  const auto t1 = Clock::now();
  times.data_wait = Seconds(t0, t1);
  FeedBatch(*net_, batch_);
  net_->set_phase(Phase::kTrain);
  net_->set_iteration(iteration_);
  if (dp_) dp_->BeginStep(iteration_);
  // With a dynamic scale an overflow skips the step, forward's too: the batch-norm statistics
  // it moves are kept from before it.
  const bool may_skip = scaler_ && scaler_->options().dynamic;
  if (may_skip) KeepBuffers();
  double loss = net_->Forward();
  if (dp_) {
    // A signal that arrived by now stops the job after this very step.
    dp_->SetControl(loss, stop != nullptr && stop->load());
  } else if (!may_skip) {
    CORTADO_CHECK(std::isfinite(loss), "the loss became ", loss, " at iteration ", iteration_,
                  " (try a lower solver.base_lr or a warmup)");
  }
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  net_->Backward(scale);
  InjectTestFault(/*reduced=*/false);
  const auto t2 = Clock::now();
  if (dp_) {
    DataParallel::StepResult r = dp_->FinishStep();
    times.comm_wait = dp_->last_wait_seconds();
    times.comm_cpu = dp_->last_comm_cpu().total_s;
    times.comm_user = dp_->last_comm_cpu().user_s;
    times.comm_system = dp_->last_comm_cpu().system_s;
    times.comm_wakeups = static_cast<double>(dp_->last_comm_wakeups());
    stop_agreed_ = r.stop;
    loss = r.loss;
    // Every rank sees the same mean loss, so all of them stop here together.
    CORTADO_CHECK(may_skip || std::isfinite(loss), "the loss became ", loss, " at iteration ",
                  iteration_, " (averaged over ", world_.size,
                  " ranks; try a lower solver.base_lr or a warmup)");
  }
  InjectTestFault(/*reduced=*/true);
  const auto t3 = Clock::now();
  last_loss_ = loss;
  last_lr_ = schedule_->At(Progress(iteration_));
  if (scaler_ || IsLowPrecision(config_.precision.compute)) {
    UpdateScaled(scale, loss);
  } else {
    solver_->Step(last_lr_);
  }
  const auto t4 = Clock::now();
  times.compute = Seconds(t1, t2) + Seconds(t3, t4);
  if (sync_bn_) times.sync_bn = sync_bn_->TakeSeconds();
  if (trace_ && iteration_ < trace_until_) TraceStep(times, t0, t3, t4);
  ++iteration_;
  if (trace_ && iteration_ == trace_until_) FinishTrace();
  return times;
}

// CORTADO_TEST_INF_GRADIENT=<rank>:<iteration>[:reduced] (tests of the overflow checks): that
// rank's first gradient element becomes inf in that iteration, after backward and before the
// all-reduce (so with several ranks, use distributed.overlap: false, where nothing is sent
// during backward, and every rank receives the inf), or with ":reduced" after the all-reduce, on
// that rank alone: only the vote can tell the others.
void Trainer::InjectTestFault(bool reduced) {
  const char* spec = std::getenv("CORTADO_TEST_INF_GRADIENT");
  if (spec == nullptr) return;
  long rank = -1, iteration = -1;
  char when[16] = "";
  const int fields = std::sscanf(spec, "%ld:%ld:%15s", &rank, &iteration, when);
  const bool after = fields == 3 && std::string(when) == "reduced";
  if (fields < 2 || (fields == 3 && !after)) {
    Fail("CORTADO_TEST_INF_GRADIENT='", spec, "': expected <rank>:<iteration>[:reduced]");
  }
  if (after != reduced || rank != world_.rank || iteration != iteration_) return;
  Param& p = *net_->params().front();
  if (p.grad.dtype() == DType::kF32) p.grad.data<float>()[0] = INFINITY;
  if (p.grad.dtype() == DType::kF64) p.grad.data<double>()[0] = INFINITY;
}

void Trainer::KeepBuffers() {
  const std::vector<Buffer*> buffers = net_->buffers();
  kept_buffers_.resize(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (!kept_buffers_[i].defined()) kept_buffers_[i] = buffers[i]->value.Clone();
    kept_buffers_[i].CopyFrom(buffers[i]->value);
  }
}

void Trainer::UpdateScaled(double scale, double loss) {
  // The one-word vote: every rank holds the same reduced gradients and loss, and the vote makes
  // the decision collective even where a rank's gradients differ from the others' (a backend's
  // all-reduce that differs in the last bit, memory corrupted on one rank).
  double overflowed = std::isfinite(loss) && LossScaler::AllFinite(net_->params()) ? 0.0 : 1.0;
  if (dp_) world_.comm->AllReduce(&overflowed, 1, dist::DataType::kF64, dist::ReduceOp::kMax);
  const bool finite = overflowed == 0.0;
  if (!finite && !(scaler_ && scaler_->options().dynamic)) {
    Fail(std::isfinite(loss) ? "the gradients are" : StrCat("the loss (", loss, ") is"),
         " not finite at iteration ", iteration_,
         scaler_ ? StrCat(" with the static loss scale ", scale,
                          " (precision.loss_scale: try dynamic, or a smaller scale)")
                 : std::string(" without loss scaling (try precision.loss_scale: dynamic, a "
                               "lower solver.base_lr or a warmup)"));
  }
  if (!scaler_) {
    solver_->Step(last_lr_);
    return;
  }
  if (!finite) {
    // Nothing of the step remains: weights and momentum are not updated, and the batch-norm
    // statistics and error-feedback residuals go back to where they were.
    const std::vector<Buffer*> buffers = net_->buffers();
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i]->value.CopyFrom(kept_buffers_[i]);
    if (dp_) dp_->DiscardStep();
  }
  const double change = scaler_->Update(finite);
  if (finite) {
    solver_->Step(last_lr_, 1.0 / scale);
  } else if (is_root()) {
    progress_.Clear();
    LogInfo("iteration ", iteration_, ": ", std::isfinite(loss) ? "gradients" : "the loss",
            " overflowed at loss scale ", scale, "; step skipped, scale now ", scaler_->scale());
  }
  // Error-feedback residuals hold what quantization lost of the scaled gradients.
  if (change != 1.0 && dp_ && dp_->options().error_feedback) dp_->ScaleResidual(change);
}

void Trainer::TraceStep(const StepTimes& times, Clock::time_point t0, Clock::time_point t_update0,
                        Clock::time_point t_update1) {
  Trace& trace = *trace_;
  const double it = static_cast<double>(iteration_);
  trace.Add(TraceTrack::kCompute, "data wait", "data", t0,
            t0 + std::chrono::duration_cast<Clock::duration>(
                     std::chrono::duration<double>(times.data_wait)),
            {{"iteration", it}});
  for (const Net::LayerTime& l : net_->layer_times()) {
    auto dur = [](double s) {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    trace.Add(TraceTrack::kCompute, l.name, "forward", l.forward_start,
              l.forward_start + dur(l.forward_s));
    if (l.backward_s > 0 && l.backward_start >= l.forward_start) {
      trace.Add(TraceTrack::kCompute, l.name, "backward", l.backward_start,
                l.backward_start + dur(l.backward_s));
    }
  }
  trace.Add(TraceTrack::kCompute, "update", "solver", t_update0, t_update1, {{"iteration", it}});
}

void Trainer::FinishTrace() {
  if (!trace_) return;
  net_->set_profiling(false);
  if (dp_) dp_->set_trace(nullptr);
  if (sync_bn_) sync_bn_->set_trace(nullptr);
  // Losing the trace (disk full) is no reason to stop training.
  try {
    trace_->Write(trace_path_);
    LogInfo("trace of iterations ", first_iteration_, "-", iteration_ - 1, " written to '",
            trace_path_, "' (", trace_->size(), " events; open in Perfetto or chrome://tracing)");
  } catch (const Error& e) {
    LogWarning("no trace: ", e.what());
  }
  trace_.reset();
}

void Trainer::RunEval() {
  if (!val_source_) return;
  auto t0 = Clock::now();
  last_eval_ = Evaluate(*net_, *val_source_, world_.comm.get());
  if (!is_root()) return;
  double epoch = static_cast<double>(iteration_) / batches_per_epoch_;
  progress_.Clear();
  LogInfo("eval  iter ", iteration_, "  epoch ", Fixed(epoch, 2), "  top1 ",
          Fixed(last_eval_.top1 * 100, 2), "%  top5 ", Fixed(last_eval_.top5 * 100, 2), "%  loss ",
          Fixed(last_eval_.loss, 4), "  (", last_eval_.images, " images, ",
          last_eval_.skipped > 0 ? StrCat(last_eval_.skipped, " unreadable record(s) skipped, ")
                                 : std::string(),
          Fixed(Seconds(t0, Clock::now()), 1), " s)");
  nlohmann::ordered_json m;
  m["event"] = "eval";
  m["iter"] = iteration_;
  m["epoch"] = epoch;
  m["top1"] = last_eval_.top1;
  m["top5"] = last_eval_.top5;
  m["loss"] = last_eval_.loss;
  m["images"] = last_eval_.images;
  m["skipped"] = last_eval_.skipped;
  metrics_.Write(m);
}

int64_t Trainer::ReplacedRecords() const {
  double replaced = static_cast<double>(train_source_->stats().skipped_records);
  if (world_.comm && world_.size > 1) {
    world_.comm->AllReduce(&replaced, 1, dist::DataType::kF64, dist::ReduceOp::kSum);
  }
  return static_cast<int64_t>(replaced);
}

void Trainer::LogInterval(int64_t replaced_records) {
  const IntervalStats& s = interval_;
  const double seconds = s.Seconds();
  const double steps = static_cast<double>(s.steps);
  const double images = steps * static_cast<double>(global_batch());
  const double img_per_s = images / std::max(seconds, 1e-9);
  const double epoch = static_cast<double>(iteration_) / batches_per_epoch_;
  const double eta = static_cast<double>(max_iter_ - iteration_) * seconds / steps;
  const double loss = s.loss_sum / steps;
  progress_.Clear();
  std::string comm;
  if (dp_) {
    comm = StrCat(", comm wait ", Fixed(1000 * s.time.comm_wait / steps, 1));
    if (s.time.sync_bn > 0) {
      comm += StrCat(" (+ sync BN ", Fixed(1000 * s.time.sync_bn / steps, 1), " in compute)");
    }
    // CPU time, not wall time: what the buckets cost the communicator's thread.
    comm += StrCat(", comm CPU ", Fixed(1000 * s.time.comm_cpu / steps, 1));
  }
  std::string scaling;
  if (scaler_) {
    scaling = StrCat("  scale ", scaler_->scale());
    if (scaler_->skipped_steps() > 0)
      scaling += StrCat(" (", scaler_->skipped_steps(), " skipped)");
  }
  // Training replaces a corrupt record by the next one (data/lmdb_source.h): say how often.
  const std::string replaced = replaced_records > 0
                                   ? StrCat("  (", replaced_records, " corrupt record(s) replaced)")
                                   : std::string();
  LogInfo("train iter ", iteration_, "/", max_iter_, "  epoch ", Fixed(epoch, 2), "  loss ",
          Fixed(loss, 4), "  lr ", last_lr_, scaling, "  ",
          Fixed(img_per_s, img_per_s < 100 ? 1 : 0), " img/s  ms/step: compute ",
          Fixed(1000 * s.time.compute / steps, 1), comm, ", data ",
          Fixed(1000 * s.time.data_wait / steps, 1), "  ETA ", FormatDuration(eta), replaced);
  nlohmann::ordered_json m;
  m["event"] = "train";
  m["iter"] = iteration_;
  m["epoch"] = epoch;
  m["loss"] = loss;
  m["lr"] = last_lr_;
  m["img_per_s"] = img_per_s;
  m["data_wait_s"] = s.time.data_wait;
  m["compute_s"] = s.time.compute;
  m["comm_wait_s"] = s.time.comm_wait;
  m["sync_bn_s"] = s.time.sync_bn;
  m["replaced_records"] = replaced_records;
  if (dp_) {
    m["wire_bytes_per_step"] = dp_->wire_bytes_per_step();
    m["comm_cpu_s"] = s.time.comm_cpu;
    m["comm_user_s"] = s.time.comm_user;
    m["comm_system_s"] = s.time.comm_system;
    m["comm_wakeups"] = s.time.comm_wakeups;
    if (dp_->options().auto_codec.enabled) {
      m["codec_plan"] = dp_->codec_plan();
      m["codec_plans"] = dp_->codec_plans();
    }
  }
  if (scaler_) {
    m["loss_scale"] = scaler_->scale();
    m["skipped_steps"] = scaler_->skipped_steps();
  }
  metrics_.Write(m);
}

void Trainer::StopHere(const char* why, const std::vector<std::string>& argv) {
  if (trace_) FinishTrace();
  std::string path = SaveCheckpointNow();
  if (is_root()) {
    progress_.Clear();
    std::string resume = tools::ResumeCommand(argv);
    if (argv.empty()) {
      resume = StrCat("cortado train --config ", tools::ShellQuote(config_.file), " --resume auto");
    } else if (world_.size > 1 && std::getenv("CORTADO_LAUNCH_COMMAND") == nullptr) {
      resume = StrCat("rerun the job's launcher (mpirun, srun, torchrun) with: ", resume);
    } else if (world_.size > world_.local_size) {
      resume += " (on every node)";
    }
    LogWarning(why, " at iteration ", iteration_, "; checkpoint saved to '", path,
               "'. Resume with: ", resume);
  }
  // Nobody leaves before rank 0's checkpoint is on disk: a launcher stops the other ranks as
  // soon as one exits non-zero.
  if (world_.comm) world_.comm->Barrier();
}

tools::RunFolder Trainer::RunFolderOf(const TrainOptions& options) const {
  tools::RunFolder folder;
  folder.checkpoint_dir = config_.checkpoint.dir;
  folder.metrics_path = options.metrics_path;
  folder.config_yaml = config_.resolved_yaml;
  folder.overwrite = options.overwrite;
  return folder;
}

int Trainer::Run(const TrainOptions& options, const std::atomic<bool>* stop) {
  const tools::RunFolder folder = RunFolderOf(options);
  Start(options.resume, &folder);
  if (is_root()) {
    if (options.overwrite) {
      if (int n = tools::ClearRunFolder(folder); n > 0) {
        LogWarning("--overwrite: deleted ", n, " checkpoint(s) of an earlier run from '",
                   folder.checkpoint_dir, "'");
      }
    }
    progress_ = ProgressBar(options.progress_bar);
    // A continued run appends; a fresh one has an empty file or was told to start over.
    metrics_.Open(options.metrics_path, !options.resume.empty());
    // Marks where a run (or a resumed part of it) begins, so plots and readers can tell the
    // parts apart and check that they belong to one config.
    nlohmann::ordered_json m;
    m["event"] = iteration_ > 0 ? "resume" : "start";
    m["iter"] = iteration_;
    m["epoch"] = static_cast<double>(iteration_) / batches_per_epoch_;
    const char* launch = std::getenv("CORTADO_LAUNCH_COMMAND");
    m["command"] = (launch != nullptr && *launch != '\0' ? std::string(launch) + " " : "") +
                   tools::ShellJoin(options.argv);
    m["config_hash"] = ConfigHash(config_.resolved_yaml);
    m["ranks"] = world_.size;
    metrics_.Write(m);
  }
  first_iteration_ = iteration_;
  if (!options.trace_path.empty()) {
    trace_ = std::make_unique<Trace>(world_.rank);
    trace_path_ = TracePathForRank(options.trace_path, world_.rank, world_.size);
    CheckTraceWritable(trace_path_);  // a bad --trace path stops before training, not after
    trace_until_ = options.trace_iters > 0 ? iteration_ + options.trace_iters : max_iter_;
    net_->set_profiling(true);
    if (dp_) dp_->set_trace(trace_.get());
    if (sync_bn_) sync_bn_->set_trace(trace_.get());
  }
  LogInfo("model: ", net_->num_parameters(),
          " parameters; data: ", train_source_->samples_per_epoch(), " training samples, ",
          batches_per_epoch_, " batches of ", config_.data.batch_size, " per epoch; ", NumThreads(),
          " thread(s)");
  if (IsLowPrecision(config_.precision.compute)) {
    const bool bf16 = config_.precision.compute == DType::kBF16;
    const bool native = bf16 && BF16GemmPath() == LowpGemmPath::kNative;
    LogInfo("precision: ", bf16 ? "bf16" : "fp16",
            " activations, f32 master weights; convolution and inner-product products ",
            native ? "in native bf16 (oneDNN, AVX512_BF16)"
            : bf16 ? (NativeBF16GemmAvailable() ? "widened to f32 (CORTADO_GEMM_BF16=widened)"
                                                : "widened to f32 (this CPU has no AVX512_BF16)")
                   : "widened to f32 (no native f16 GEMM on CPUs)",
            "; loss scale ",
            scaler_ ? (scaler_->options().dynamic ? StrCat("dynamic from ", scaler_->scale())
                                                  : StrCat(scaler_->scale()))
                    : std::string("none"));
  }
  if (dp_) {
    const auto& buckets = dp_->buckets();
    std::string sizes;
    for (const auto& b : buckets) {
      if (!sizes.empty()) sizes += " + ";
      sizes += Bytes(static_cast<double>(b.end - b.begin) *
                     static_cast<double>(DTypeSize(dp_->gradient_block().dtype())));
    }
    LogInfo("data-parallel: ", world_.size, " ranks (", world_.backend, "), global batch ",
            global_batch(), " (", world_.size, " x ", config_.data.batch_size, "), learning rate ",
            config_.solver.schedule.base_lr, " (solver.base_lr, not scaled with the global batch)");
    // Each codec once, in bucket order (compared as names: "f16" is part of "bf16").
    std::vector<dist::CodecKind> kinds;
    std::string codecs;
    for (const auto& b : buckets) {
      if (std::find(kinds.begin(), kinds.end(), b.codec) == kinds.end()) {
        kinds.push_back(b.codec);
        codecs += StrCat(codecs.empty() ? "" : ", ", dist::CodecName(b.codec));
      }
    }
    if (dp_->options().auto_codec.enabled) {
      codecs = dp_->codec_plans() > 0
                   ? StrCat("; codecs auto, as planned before the checkpoint: ", codecs)
                   : StrCat("; codecs auto (",
                            dist::CodecName(dp_->options().auto_codec.candidates.front()),
                            " for the first ", dp_->options().auto_codec.warmup_steps,
                            " step(s), then as planned)");
    } else if (codecs != "f32") {
      codecs = StrCat("; codecs ", codecs, " (", dist::RoundingName(dp_->options().rounding),
                      dp_->options().error_feedback ? ", error feedback" : "",
                      "): ", Bytes(dp_->wire_bytes_per_step()), " sent per step instead of ",
                      Bytes(dp_->f32_bytes_per_step()));
    } else {
      codecs = StrCat("; ", Bytes(dp_->wire_bytes_per_step()), " sent per step");
    }
    LogInfo("gradients: ", buckets.size(), " bucket(s) of ", sizes, codecs, ", overlap ",
            dp_->options().overlap ? "on" : "off", ", all-reduce ", dp_->bucket_algorithms(),
            "; batch norm: ",
            sync_bn_ ? (config_.distributed.sync_bn
                            ? StrCat("synchronized over groups of ", sync_bn_->group_size())
                            : std::string("per rank (sync_bn: false)"))
                     : std::string("per rank"));
  }
  LogInfo("training to iteration ", max_iter_, " (",
          Fixed(static_cast<double>(max_iter_) / batches_per_epoch_, 2),
          " epochs); checkpoints in '", config_.checkpoint.dir, "'");
  train_source_->Start(iteration_ / batches_per_epoch_, iteration_ % batches_per_epoch_);

  interval_.Reset();
  stop_agreed_ = false;
  const auto run_start = Clock::now();
  while (iteration_ < max_iter_) {
    if (options.stop_at > 0 && iteration_ >= options.stop_at) {
      StopHere("stopped", options.argv);
      return 130;
    }
    // One process stops as soon as it sees the signal; ranks stop after the step in which
    // one of them voted, which all of them learn together.
    if (dp_ ? stop_agreed_ : stop != nullptr && stop->load()) {
      StopHere("interrupted", options.argv);
      return 130;
    }
    StepTimes times = Step(stop);
    interval_.Add(last_loss_, times);
    const bool last = iteration_ == max_iter_;
    if (iteration_ % config_.log_interval == 0 || last) {
      const int64_t replaced = ReplacedRecords();
      if (is_root()) LogInterval(replaced);
      interval_.Reset();
    }
    if (is_root()) progress_.Update(iteration_, max_iter_, first_iteration_, last_loss_);
    if (Crossed(config_.solver.eval_interval, iteration_) || (last && val_source_)) RunEval();
    if (Crossed(config_.checkpoint.every, iteration_) || last) {
      std::string path = SaveCheckpointNow();
      if (is_root()) {
        progress_.Clear();
        LogInfo("checkpoint saved to '", path, "'");
      }
    }
  }
  if (trace_) FinishTrace();
  progress_.Clear();
  SourceStats stats = train_source_->stats();
  if (is_root() && stats.loader_threads > 0) {
    // The decode threads come on top of the compute budget (README, Threads): say what they
    // cost, so a loader that competes with compute shows.
    const double wall = Seconds(run_start, Clock::now());
    LogInfo("data loader: ", stats.loader_threads, " decode thread(s) used ",
            Fixed(stats.loader_cpu_seconds, 1), " CPU-s in ", Fixed(wall, 1), " s (",
            Fixed(100 * stats.loader_cpu_seconds / std::max(wall, 1e-9), 1),
            "% of one core) beside ", NumThreads(), " compute thread(s); training waited ",
            Fixed(stats.wait_seconds, 1), " s for data");
  }
  if (stats.skipped_records > 0) {
    LogWarning(stats.skipped_records, " corrupt record(s) were skipped during training");
  }
  return 0;
}

}  // namespace cortado
