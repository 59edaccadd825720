#include "tools/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "data/class_names.h"
#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/io/yaml_config.h"
#include "engine/tensor/device_runtime.h"
#include "tools/command_line.h"
#include "tools/train_reporter.h"

namespace cortado {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Trainer::Trainer(RunConfig config, World world)
    : config_(std::move(config)),
      world_(std::move(world)),
      run_id_(tools::NewRunId()),
      reporter_(std::make_unique<TrainReporter>(*this)) {
  const uint64_t seed = config_.seed;
  const ShardSpec shard{world_.rank, world_.size};
  if (world_.size > 1) TakeRankDevice();
  // The sources write batches in the net's memory format.
  config_.data.channels_last = ConfigLayout(config_) == MemoryFormat::kNHWC;
  train_source_ = MakeTrainSource(config_.data, shard, seed);
  if (HasValidation(config_.data)) {
    val_source_ = MakeEvalSource(config_.data, shard);
  }
  const std::string classes_warning = CheckClassNames(config_.data);
  if (!classes_warning.empty() && world_.rank == 0) LogWarning(classes_warning);
  NetSpec spec = MakeNetSpec(config_, train_source_->sample_shape(), train_source_->num_classes(),
                             config_.data.batch_size);
  // Activations follow the net's memory plan: each goes back to the pool after the last
  // backward that reads it (engine/tensor/memory_plan.h).
  net_ = std::make_unique<Net>(spec, seed, config_.precision.compute,
                               ConfigNetOptions(config_, NetMode::kTrain));
  solver_ = std::make_unique<SgdSolver>(net_->params(), config_.solver.sgd);
  if (config_.precision.loss_scaling) {
    scaler_ = std::make_unique<LossScaler>(config_.precision.scaler);
  }
  schedule_ = std::make_unique<LrSchedule>(config_.solver.schedule);
  batches_per_epoch_ = train_source_->batches_per_epoch();
  max_iter_ = config_.solver.epoch_based ? config_.solver.max_epochs * batches_per_epoch_
                                         : config_.solver.max_iter;
  if (world_.size > 1) JoinRanks();
}

// One device per rank on a machine, as torchrun lays ranks out: device N with several ranks puts
// local rank l on N + l (device: cuda gives rank l cuda:l; the test device, test:l).
void Trainer::TakeRankDevice() {
  if (config_.device == Device::CPU()) return;
  const Device first = config_.device;
  config_.device.index += world_.local_rank;
  std::string why;
  CORTADO_CHECK(DeviceUsable(config_.device, &why), "device: ", first.ToString(), " with ",
                world_.local_size, " ranks on this machine gives local rank ", world_.local_rank,
                " ", config_.device.ToString(), ", which it cannot use (", why,
                "): one device per rank, so run at most as many ranks per machine as devices");
}

void Trainer::JoinRanks() {
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
  options.discardable_steps = scaler_ != nullptr && scaler_->options().dynamic;
  options.seed = config_.seed;
  options.auto_codec = d.auto_codec;
  // Rank 0 makes every codec decision for all ranks (DataParallel), so only its
  // CORTADO_AUTO_LINK counts; the other ranks' environment is not read.
  if (options.auto_codec.enabled && world_.rank == 0) {
    options.auto_codec.link_override = AutoLinkFromEnv();
  }
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

void Trainer::AttachTrace(Trace* trace) {
  net_->set_profiling(trace != nullptr);
  if (dp_) dp_->set_trace(trace);
  if (sync_bn_) sync_bn_->set_trace(trace);
}

int Trainer::Run(const TrainOptions& options, const std::atomic<bool>* stop) {
  const tools::RunFolder folder = RunFolderOf(options);
  Start(options.resume, &folder);
  if (is_root() && options.overwrite) {
    if (int n = tools::ClearRunFolder(folder); n > 0) {
      LogWarning("--overwrite: deleted ", n, " checkpoint(s) of an earlier run from '",
                 folder.checkpoint_dir, "'");
    }
  }
  reporter_->Open(options);
  if (is_root() && options.stop_at > 0 && iteration_ > 0 && iteration_ >= options.stop_at) {
    LogWarning("--stop-at-iter ", options.stop_at, ": this run resumed at iteration ", iteration_,
               ", already past it, so it stops at once without training (give a later "
               "iteration, or leave --stop-at-iter out to train on to ",
               max_iter_, ")");
  }
  train_source_->Start(iteration_ / batches_per_epoch_, iteration_ % batches_per_epoch_);
  staged_ = StagedBatch{};  // a batch staged before the source moved is not the next one
  stop_agreed_ = false;
  const auto run_start = Clock::now();
  const int code = Loop(options, stop);
  if (code != 0) return code;
  reporter_->FinishTrace();
  reporter_->Finish(run_start);
  return 0;
}

int Trainer::Loop(const TrainOptions& options, const std::atomic<bool>* stop) {
  while (iteration_ < max_iter_) {
    if (options.stop_at > 0 && iteration_ >= options.stop_at) {
      return StopHere(StrCat("stopped at iteration ", iteration_), options.argv);
    }
    if (StopVoted(stop)) {
      return StopHere(StrCat("interrupted at iteration ", iteration_), options.argv);
    }
    reporter_->Step(Step(stop));
    const bool last = iteration_ == max_iter_;
    // The checkpoint comes before the evaluation: a stop during the evaluation loses no training.
    if (Crossed(config_.checkpoint.every, iteration_) || last) {
      reporter_->Saved(SaveCheckpointNow());
    }
    if (!val_source_ || !(Crossed(config_.solver.eval_interval, iteration_) || last)) continue;
    if (StopVoted(stop)) {
      return StopHere(StrCat("interrupted at iteration ", iteration_), options.argv);
    }
    const EvalResult eval = RunEval(stop);
    if (eval.interrupted) {
      return StopHere(
          StrCat("interrupted during the ", last ? "final " : "", "evaluation at iteration ",
                 iteration_, " (after ", eval.batches, " of ", eval.total_batches,
                 " batches): the evaluation is abandoned, not the training"),
          options.argv);
    }
  }
  return 0;
}

// One process stops as soon as it sees the signal; ranks stop after the step in which one of
// them voted, which all of them learn together.
bool Trainer::StopVoted(const std::atomic<bool>* stop) const {
  return dp_ ? stop_agreed_ : stop != nullptr && stop->load();
}

int Trainer::StopHere(const std::string& what, const std::vector<std::string>& argv) {
  reporter_->FinishTrace();
  const std::string path = saved_at_ == iteration_ ? saved_path_ : SaveCheckpointNow();
  reporter_->Stopped(what, path, argv);
  // Nobody leaves before rank 0's checkpoint is on disk: a launcher stops the other ranks as
  // soon as one exits non-zero.
  if (world_.comm) world_.comm->Barrier();
  return 130;
}

EvalResult Trainer::RunEval(const std::atomic<bool>* stop) {
  reporter_->Clear();
  const auto t0 = Clock::now();
  EvalControl control;
  control.stop = stop;
  EvalResult result = Evaluate(*net_, *val_source_, world_.comm.get(), control);
  if (result.interrupted) return result;
  last_eval_ = result;
  reporter_->Eval(result, Seconds(t0, Clock::now()));
  return result;
}

StepTimes Trainer::Step(const std::atomic<bool>* stop) {
  StepTimes times;
  const auto t0 = Clock::now();
  // On a device this step's batch was staged during the last one (ForwardBackward), except first.
  if (!staged_.defined()) {
    train_source_->Next(batch_);
    if (net_->device() != Device::CPU()) staged_ = StageBatch(*net_, batch_);
  }
  const auto t1 = Clock::now();
  times.data_wait = Seconds(t0, t1) + staging_seconds_;
  staging_seconds_ = 0;
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  double loss = ForwardBackward(scale, stop);
  const auto t2 = Clock::now();
  if (dp_) loss = WaitForBuckets(times);
  InjectTestFault(/*reduced=*/true);
  const auto t3 = Clock::now();
  last_loss_ = loss;
  last_lr_ = schedule_->At(Progress(iteration_));
  if (VoteFinite(scale, loss)) Update(scale);
  const auto t4 = Clock::now();
  times.compute = Seconds(t1, t2) + Seconds(t3, t4);
  if (sync_bn_) times.sync_bn = sync_bn_->TakeSeconds();
  const bool traced = reporter_->tracing(iteration_);
  if (traced) reporter_->TraceStep(times, t0, t3, t4);
  ++iteration_;
  if (traced && !reporter_->tracing(iteration_)) reporter_->FinishTrace();
  return times;
}

double Trainer::ForwardBackward(double scale, const std::atomic<bool>* stop) {
  if (staged_.defined()) {
    FeedStaged(*net_, std::move(staged_));
    staged_ = StagedBatch{};
  } else {
    FeedBatch(*net_, batch_);
  }
  net_->set_phase(Phase::kTrain);
  net_->set_iteration(iteration_);
  if (dp_) dp_->BeginStep(iteration_);
  // With a dynamic scale an overflow skips the step, forward's too: the batch-norm statistics
  // it moves are kept from before it.
  const bool may_skip = scaler_ && scaler_->options().dynamic;
  if (may_skip) KeepBuffers();
  const double loss = net_->Forward();
  if (dp_) {
    // A signal that arrived by now stops the job after this very step.
    dp_->SetControl(loss, stop != nullptr && stop->load());
  } else if (!may_skip) {
    CORTADO_CHECK(std::isfinite(loss), "the loss became ", loss, " at iteration ", iteration_,
                  " (try a lower solver.base_lr or a warmup)");
  }
  net_->Backward(scale);
  if (net_->device() != Device::CPU() && iteration_ + 1 < max_iter_) {
    // The next step's batch: read and copied while the device runs this step's backward.
    const auto t0 = Clock::now();
    train_source_->Next(batch_);
    staged_ = StageBatch(*net_, batch_);
    staging_seconds_ = Seconds(t0, Clock::now());
  }
  InjectTestFault(/*reduced=*/false);
  return loss;
}

double Trainer::WaitForBuckets(StepTimes& times) {
  const DataParallel::StepResult r = dp_->FinishStep();
  times.comm_wait = dp_->last_wait_seconds();
  times.comm_cpu = dp_->last_comm_cpu().total_s;
  times.comm_user = dp_->last_comm_cpu().user_s;
  times.comm_system = dp_->last_comm_cpu().system_s;
  times.comm_wakeups = static_cast<double>(dp_->last_comm_wakeups());
  stop_agreed_ = r.stop;
  // Every rank sees the same mean loss, so all of them stop here together.
  const bool may_skip = scaler_ && scaler_->options().dynamic;
  CORTADO_CHECK(may_skip || std::isfinite(r.loss), "the loss became ", r.loss, " at iteration ",
                iteration_, " (averaged over ", world_.size,
                " ranks; try a lower solver.base_lr or a warmup)");
  return r.loss;
}

bool Trainer::VoteFinite(double scale, double loss) {
  if (!scaler_ && !IsLowPrecision(config_.precision.compute)) return true;
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
  if (!scaler_) return true;
  if (!finite) {
    // Nothing of the step remains: weights and momentum are not updated, and the batch-norm
    // statistics and error-feedback residuals go back to where they were.
    const std::vector<Buffer*> buffers = net_->buffers();
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i]->value.CopyFrom(kept_buffers_[i]);
    if (dp_) dp_->DiscardStep();
  }
  const double change = scaler_->Update(finite);
  if (!finite) reporter_->Overflow(iteration_, loss, scale, scaler_->scale());
  // Error-feedback residuals hold what quantization lost of the scaled gradients.
  if (change != 1.0 && dp_ && dp_->options().error_feedback) dp_->ScaleResidual(change);
  return finite;
}

void Trainer::Update(double scale) {
  if (scaler_) {
    solver_->Step(last_lr_, 1.0 / scale);
  } else {
    solver_->Step(last_lr_);
  }
}

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
  // On a device through explicit copies of the first element.
  Tensor first = p.grad.View({1}, 0);
  Tensor host = first.To(Device::CPU());
  if (host.dtype() == DType::kF32) host.data<float>()[0] = INFINITY;
  if (host.dtype() == DType::kF64) host.data<double>()[0] = INFINITY;
  if (first.device() != Device::CPU()) first.CopyFrom(host.To(first.device()));
}

void Trainer::KeepBuffers() {
  const std::vector<Buffer*> buffers = net_->buffers();
  kept_buffers_.resize(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (!kept_buffers_[i].defined()) kept_buffers_[i] = buffers[i]->value.Clone();
    kept_buffers_[i].CopyFrom(buffers[i]->value);
  }
}

}  // namespace cortado
