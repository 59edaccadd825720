#include "tools/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "engine/error.h"
#include "engine/log.h"
#include "engine/thread_pool.h"
#include "models/builders.h"

namespace cortado {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string Fixed(double v, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

// Points the net's inputs at the batch (no copy: the net reads them during this step only).
void FeedBatch(Net& net, const Batch& batch) {
  CORTADO_CHECK(batch.images.dtype() == DType::kF32 && batch.labels.dtype() == DType::kI32,
                "data source produced ", batch.images.ToString(), " images and ",
                batch.labels.ToString(), " labels (want f32 and i32)");
  Tensor& data = net.input("data");
  CORTADO_CHECK(batch.images.ndim() == 4 && data.ndim() == 4 &&
                    batch.images.dim(1) == data.dim(1) && batch.images.dim(2) == data.dim(2) &&
                    batch.images.dim(3) == data.dim(3),
                "data source produced images ", batch.images.ToString(),
                " but the net expects [N, ", data.dim(1), ", ", data.dim(2), ", ", data.dim(3),
                "]");
  data = batch.images;
  net.input("label") = batch.labels;
}

double BlobValue(Net& net, const std::string& name) {
  if (!net.has_blob(name)) return NAN;
  return ElementAsDouble(net.blob(name)->data, 0);
}

}  // namespace

NetSpec MakeNetSpec(const RunConfig& config, const Shape& sample_shape, int64_t num_classes,
                    int64_t batch_size) {
  CORTADO_CHECK(sample_shape.size() == 3, "data samples must be [C, H, W], got ",
                ShapeString(sample_shape));
  ModelOptions o;
  o.num_classes = config.model.num_classes > 0 ? config.model.num_classes : num_classes;
  CORTADO_CHECK(o.num_classes >= 1, "model.num_classes is not set and the data does not say "
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
  if (!config.model.builder.empty()) return BuildModel(config.model.builder, o);
  NetSpec spec;
  spec.name = "graph";
  spec.inputs = ImageInputs(o);
  spec.layers = config.model.layers;
  return spec;
}

EvalResult Evaluate(Net& net, BatchSource& source) {
  Phase previous = net.phase();
  net.set_phase(Phase::kTest);
  EvalResult r;
  double top1 = 0, top5 = 0, loss = 0;
  Batch batch;
  source.Start(0, 0);
  while (source.Next(batch)) {
    FeedBatch(net, batch);
    double l = net.Forward();
    double n = static_cast<double>(batch.size);
    loss += l * n;
    top1 += BlobValue(net, "top1") * n;
    top5 += BlobValue(net, "top5") * n;
    r.images += batch.size;
  }
  net.set_phase(previous);
  if (r.images > 0) {
    r.top1 = top1 / r.images;
    r.top5 = top5 / r.images;
    r.loss = loss / r.images;
  }
  return r;
}

void LoadWeights(Net& net, const Checkpoint& ckpt, const std::string& path) {
  auto load = [&](const std::string& key, Tensor& into, const std::string& what) {
    const Tensor* t = ckpt.Find(key);
    CORTADO_CHECK(t != nullptr, "checkpoint '", path, "' has no ", what,
                  " (was it written for another model?)");
    CORTADO_CHECK(t->shape() == into.shape(), "checkpoint '", path, "': ", what, " has shape ",
                  ShapeString(t->shape()), ", the model wants ", ShapeString(into.shape()));
    into.ConvertFrom(*t);
  };
  for (Param* p : net.params()) load("param/" + p->name, p->value, "parameter '" + p->name + "'");
  for (Buffer* b : net.buffers()) load("buffer/" + b->name, b->value, "buffer '" + b->name + "'");
}

Trainer::Trainer(RunConfig config) : config_(std::move(config)) {
  const uint64_t seed = config_.seed;
  train_source_ = MakeTrainSource(config_.data, ShardSpec{}, seed);
  if (!config_.data.val.empty() || config_.data.type == "synthetic") {
    val_source_ = MakeEvalSource(config_.data, ShardSpec{});
  }
  NetSpec spec = MakeNetSpec(config_, train_source_->sample_shape(),
                             train_source_->num_classes(), config_.data.batch_size);
  net_ = std::make_unique<Net>(spec, seed);
  solver_ = std::make_unique<SgdSolver>(net_->params(), config_.solver.sgd);
  schedule_ = std::make_unique<LrSchedule>(config_.solver.schedule);
  batches_per_epoch_ = train_source_->batches_per_epoch();
  max_iter_ = config_.solver.epoch_based ? config_.solver.max_epochs * batches_per_epoch_
                                         : config_.solver.max_iter;
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

void Trainer::ClearProgressBar() {
  if (!progress_bar_) return;
  // The bar lives on stdout and log lines on stderr: erase and flush before a log line.
  std::printf("\r\033[K");
  std::fflush(stdout);
}

void Trainer::WriteMetric(const std::string& json) {
  if (!metrics_.is_open()) return;
  metrics_ << json << "\n";
  metrics_.flush();
}

void Trainer::Resume(const std::string& what) {
  std::string path = what;
  Checkpoint ckpt;
  if (what == "auto") {
    path.clear();
    for (const std::string& candidate : ListCheckpoints(config_.checkpoint.dir)) {
      try {
        ckpt = LoadCheckpoint(candidate);
        path = candidate;
        break;
      } catch (const Error& e) {
        LogWarning("skipping unusable checkpoint: ", e.what());
      }
    }
    if (path.empty()) {
      LogInfo("no checkpoint in '", config_.checkpoint.dir, "'; starting fresh");
      return;
    }
  } else {
    ckpt = LoadCheckpoint(path);
  }
  LoadWeights(*net_, ckpt, path);
  std::vector<Buffer>& momentum = solver_->state();
  for (Buffer& b : momentum) {
    const Tensor* t = ckpt.Find("momentum/" + b.name);
    CORTADO_CHECK(t != nullptr && t->shape() == b.value.shape(), "checkpoint '", path,
                  "' has no matching solver state for '", b.name, "'");
    b.value.ConvertFrom(*t);
  }
  iteration_ = ckpt.MetaInt("iteration");
  CORTADO_CHECK(iteration_ >= 0 && iteration_ <= max_iter_, "checkpoint '", path,
                "' is at iteration ", iteration_, ", beyond this run's ", max_iter_);
  int64_t saved_bpe = ckpt.MetaInt("batches_per_epoch");
  CORTADO_CHECK(saved_bpe == batches_per_epoch_, "checkpoint '", path, "' was written with ",
                saved_bpe, " batches per epoch, this run has ", batches_per_epoch_,
                " (batch size or data changed)");
  LogInfo("resumed from '", path, "' at iteration ", iteration_, " (epoch ",
          iteration_ / batches_per_epoch_, ")");
}

std::string Trainer::SaveCheckpointNow() {
  Checkpoint ckpt;
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
  for (Param* p : net_->params()) ckpt.Add("param/" + p->name, p->value);
  for (Buffer* b : net_->buffers()) ckpt.Add("buffer/" + b->name, b->value);
  for (Buffer& b : solver_->state()) ckpt.Add("momentum/" + b.name, b.value);
  std::string path =
      (std::filesystem::path(config_.checkpoint.dir) / CheckpointFileName(iteration_)).string();
  SaveCheckpoint(ckpt, path);
  PruneCheckpoints(config_.checkpoint.dir, config_.checkpoint.keep);
  return path;
}

void Trainer::TrainStep() {
  auto t0 = Clock::now();
  train_source_->Next(batch_);
  wait_seconds_ += Since(t0);
  FeedBatch(*net_, batch_);
  net_->set_phase(Phase::kTrain);
  net_->set_iteration(iteration_);
  last_loss_ = net_->Forward();
  CORTADO_CHECK(std::isfinite(last_loss_), "the loss became ", last_loss_, " at iteration ",
                iteration_, " (try a lower solver.base_lr or a warmup)");
  net_->Backward();
  last_lr_ = schedule_->At(Progress(iteration_));
  solver_->Step(last_lr_);
  ++iteration_;
}

void Trainer::RunEval() {
  if (!val_source_) return;
  auto t0 = Clock::now();
  last_eval_ = Evaluate(*net_, *val_source_);
  double epoch = Progress(iteration_) * (config_.solver.epoch_based ? 1.0 : 1.0 / batches_per_epoch_);
  ClearProgressBar();
  LogInfo("eval  iter ", iteration_, "  epoch ", Fixed(epoch, 2), "  top1 ",
          Fixed(last_eval_.top1 * 100, 2), "%  top5 ", Fixed(last_eval_.top5 * 100, 2),
          "%  loss ", Fixed(last_eval_.loss, 4), "  (", last_eval_.images, " images, ",
          Fixed(Since(t0), 1), " s)");
  WriteMetric(StrCat("{\"event\":\"eval\",\"iter\":", iteration_, ",\"epoch\":", JsonNumber(epoch),
                     ",\"top1\":", JsonNumber(last_eval_.top1), ",\"top5\":",
                     JsonNumber(last_eval_.top5), ",\"loss\":", JsonNumber(last_eval_.loss),
                     ",\"images\":", last_eval_.images, "}"));
}

int Trainer::Run(const TrainOptions& options, const std::atomic<bool>* stop) {
  progress_bar_ = options.progress_bar;
  if (!options.resume.empty()) Resume(options.resume);
  if (!options.metrics_path.empty()) {
    std::filesystem::path parent = std::filesystem::path(options.metrics_path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    auto mode = std::ios::out | (iteration_ > 0 ? std::ios::app : std::ios::trunc);
    metrics_.open(options.metrics_path, mode);
    CORTADO_CHECK(metrics_.good(), "cannot write metrics file '", options.metrics_path, "'");
  }
  LogInfo("model: ", net_->num_parameters(), " parameters; data: ",
          train_source_->samples_per_epoch(), " training samples, ", batches_per_epoch_,
          " batches of ", config_.data.batch_size, " per epoch; ", NumThreads(), " thread(s)");
  LogInfo("training to iteration ", max_iter_, " (",
          Fixed(static_cast<double>(max_iter_) / batches_per_epoch_, 2),
          " epochs); checkpoints in '", config_.checkpoint.dir, "'");
  train_source_->Start(iteration_ / batches_per_epoch_, iteration_ % batches_per_epoch_);

  double sum_loss = 0;
  int64_t steps = 0;
  wait_seconds_ = 0;
  auto interval_start = Clock::now();
  auto bar_time = Clock::now();
  const auto run_start = Clock::now();
  const int64_t first_iteration = iteration_;
  while (iteration_ < max_iter_) {
    bool stop_here = options.stop_at > 0 && iteration_ >= options.stop_at;
    if (stop_here || (stop != nullptr && stop->load())) {
      std::string path = SaveCheckpointNow();
      ClearProgressBar();
      LogWarning(stop_here ? "stopped" : "interrupted", " at iteration ", iteration_, "; checkpoint saved to '", path,
                 "'. Resume with: cortado train --config ", config_.file, " --resume auto");
      return 130;
    }
    TrainStep();
    sum_loss += last_loss_;
    ++steps;
    bool log_now = iteration_ % config_.log_interval == 0 || iteration_ == max_iter_;
    if (log_now) {
      double seconds = Since(interval_start);
      double images = static_cast<double>(steps * config_.data.batch_size);
      double img_per_s = images / std::max(seconds, 1e-9);
      double epoch = static_cast<double>(iteration_) / batches_per_epoch_;
      double eta = (max_iter_ - iteration_) * seconds / steps;
      ClearProgressBar();
      LogInfo("train iter ", iteration_, "/", max_iter_, "  epoch ", Fixed(epoch, 2), "  loss ",
              Fixed(sum_loss / steps, 4), "  lr ", last_lr_, "  ",
              static_cast<int64_t>(img_per_s), " img/s  data_wait ", Fixed(wait_seconds_, 3),
              " s  ETA ", FormatDuration(eta));
      WriteMetric(StrCat("{\"event\":\"train\",\"iter\":", iteration_, ",\"epoch\":",
                         JsonNumber(epoch), ",\"loss\":", JsonNumber(sum_loss / steps),
                         ",\"lr\":", JsonNumber(last_lr_), ",\"img_per_s\":",
                         JsonNumber(img_per_s), ",\"data_wait_s\":", JsonNumber(wait_seconds_),
                         "}"));
      sum_loss = 0;
      steps = 0;
      wait_seconds_ = 0;
      interval_start = Clock::now();
    }
    if (progress_bar_ && std::chrono::duration<double>(Clock::now() - bar_time).count() > 0.25) {
      bar_time = Clock::now();
      const int width = 30;
      int filled = static_cast<int>(width * iteration_ / max_iter_);
      std::string bar(filled, '#');
      bar.resize(width, '.');
      double rate = static_cast<double>(iteration_ - first_iteration) /
                    std::max(1e-9, Since(run_start));
      std::printf("\r[%s] %5.1f%%  iter %lld/%lld  loss %.4f  ETA %s", bar.c_str(),
                  100.0 * iteration_ / max_iter_, static_cast<long long>(iteration_),
                  static_cast<long long>(max_iter_), last_loss_,
                  FormatDuration((max_iter_ - iteration_) / std::max(rate, 1e-9)).c_str());
      std::fflush(stdout);
    }
    bool last = iteration_ == max_iter_;
    if (Crossed(config_.solver.eval_interval, iteration_) || (last && val_source_)) RunEval();
    if (Crossed(config_.checkpoint.every, iteration_) || last) {
      std::string path = SaveCheckpointNow();
      ClearProgressBar();
      LogInfo("checkpoint saved to '", path, "'");
    }
  }
  ClearProgressBar();
  SourceStats stats = train_source_->stats();
  if (stats.skipped_records > 0) {
    LogWarning(stats.skipped_records, " corrupt record(s) were skipped during training");
  }
  return 0;
}

}  // namespace cortado
