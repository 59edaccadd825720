// Trainer: the training loop behind `cortado train` (and `cortado bench train`'s steps): data
// source -> net forward/backward -> gradient all-reduce -> SGD step, with evaluation,
// checkpoints, resume and clean interruption. What the user sees (log lines, metrics file,
// progress bar, trace) is its TrainReporter's (tools/train_reporter.h); its checkpoints are
// collected from the parts that own them (tools/trainer_checkpoint.cpp).
//
// Data parallelism: with W ranks (tools/world.h) each rank reads its shard of every epoch
// (rank r of W), the DataParallel glue (engine/parallel/data_parallel.h) averages gradients in
// buckets overlapped with backward, synchronized batch norm combines statistics over its group, and
// evaluation sums every rank's counts. Rank 0 is the only one that reads a checkpoint to
// resume (everyone else receives rank 0's state), writes checkpoints, metrics and the progress
// bar; all ranks stop together (Ctrl-C, --stop-at-iter) at the same step, or during an
// evaluation at the same batch.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch_source.h"
#include "engine/base/trace.h"
#include "engine/graph/loss_scaler.h"
#include "engine/graph/net.h"
#include "engine/graph/solver.h"
#include "engine/io/checkpoint.h"
#include "engine/parallel/data_parallel.h"
#include "engine/parallel/sync_batch_norm.h"
#include "tools/device_feed.h"
#include "tools/evaluate.h"
#include "tools/metrics.h"
#include "tools/net_setup.h"
#include "tools/run_config.h"
#include "tools/run_folder.h"
#include "tools/world.h"

namespace cortado {

struct TrainOptions {
  std::vector<std::string> argv;  // the command line it was started with (resume hint, metrics)
  std::string resume;             // "", "auto" or a checkpoint path
  bool overwrite = false;         // start over in a folder an earlier run left (tools/run_folder.h)
  std::string metrics_path;       // JSON lines; "" for none
  bool progress_bar = false;      // live bar (when stdout is a terminal)
  int64_t stop_at = 0;            // > 0: stop there as if interrupted (for job time limits, tests)
  std::string trace_path;         // Chrome trace of the first trace_iters iterations; "" for none
  int64_t trace_iters = 20;       // 0: every iteration
};

class TrainReporter;

class Trainer : public CheckpointState {
 public:
  // Builds sources (this rank's shard), net, solver and, with several ranks, the data-parallel
  // glue; checks that every rank runs the same job. Collective when world.size > 1.
  explicit Trainer(RunConfig config, World world = World{});
  ~Trainer() override;

  // Trains to the end (returns 0) or until `stop` becomes true on any rank or stop_at is
  // reached (checkpoint, prints the command that resumes, returns 130). The end-of-training
  // checkpoint comes before the final evaluation, and a stop during an evaluation abandons it
  // (between two batches, on every rank): it returns 130 with the training saved. Rank 0's
  // metrics file gets a "start" or "resume" event first.
  int Run(const TrainOptions& options, const std::atomic<bool>* stop = nullptr);
  // The folder and metrics file a run with these options writes.
  tools::RunFolder RunFolderOf(const TrainOptions& options) const;

  // Puts every rank in the same starting state: rank 0 resumes from `resume` ("", "auto" or a
  // path) and sends its weights, buffers, solver state and position to the others. With a
  // folder, rank 0 also checks that this run may use it (tools/run_folder.h); every rank gets
  // the same error when it may not.
  void Start(const std::string& resume, const tools::RunFolder* folder = nullptr);
  // One training step on the next batch, as a row of stages: data, forward and backward, wait
  // for the gradient buckets, the finiteness vote, the update. With several ranks, a `stop`
  // that is true once forward has run is this rank's vote to stop after the step (see
  // stop_agreed()).
  StepTimes Step(const std::atomic<bool>* stop = nullptr);
  // True when some rank voted to stop during the last step.
  bool stop_agreed() const { return stop_agreed_; }

  Net& net() { return *net_; }
  int64_t iteration() const { return iteration_; }
  int64_t max_iter() const { return max_iter_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t global_batch() const { return config_.data.batch_size * world_.size; }
  const RunConfig& config() const { return config_; }
  const World& world() const { return world_; }
  const BatchSource& train_source() const { return *train_source_; }
  const EvalResult& last_eval() const { return last_eval_; }
  double last_loss() const { return last_loss_; }
  double last_lr() const { return last_lr_; }
  // The loss scaler (null when precision.loss_scale is 1).
  const LossScaler* loss_scaler() const { return scaler_.get(); }
  // The data-parallel glue and the batch-norm reducer (null with one rank).
  const DataParallel* data_parallel() const { return dp_.get(); }
  const SyncBatchNormReducer* sync_batch_norm() const { return sync_bn_.get(); }
  // The id every checkpoint of this run carries: new for a fresh start, the checkpoint's on
  // resume.
  const std::string& run_id() const { return run_id_; }
  // Records the net's layers, the gradient buckets and synchronized batch norm in `trace`
  // (null: stops recording).
  void AttachTrace(Trace* trace);

  // Checkpoint state of the run itself: position in the data, seed, config, world shape.
  void SaveState(Checkpoint& checkpoint) const override;
  void LoadState(const Checkpoint& checkpoint, const std::string& path) override;

 private:
  // Construction, with several ranks: this rank's device (device index + local rank), then
  // synchronized batch norm and the data-parallel glue.
  void TakeRankDevice();
  void JoinRanks();
  std::string JobDescription() const;

  // Checkpoints (tools/trainer_checkpoint.cpp). The whole state: the run's, the net's, the
  // solver's, the loss scaler's and the data-parallel glue's.
  Checkpoint CollectState() const;
  void LoadAllState(const Checkpoint& checkpoint, const std::string& path);
  // This rank's part of Start: resume or initialize from model.weights, check the folder.
  void StartHere(const std::string& resume, const tools::RunFolder* folder);
  // True when it loaded a checkpoint ("auto" in a folder without one starts fresh).
  bool Resume(const std::string& what);
  // A fresh start with model.weights: rank 0 initializes the net from that file.
  void InitFromWeights();
  void WarnAboutConfigChanges(const Checkpoint& checkpoint, const std::string& path) const;
  // Every rank must call it (error feedback gathers the ranks' residuals); rank 0 writes the
  // checkpoint and returns its path, the others return "".
  std::string SaveCheckpointNow();

  // The loop of Run; returns Run's code.
  int Loop(const TrainOptions& options, const std::atomic<bool>* stop);
  // Whether the job stops before its next step or evaluation (all ranks agree).
  bool StopVoted(const std::atomic<bool>* stop) const;
  // Checkpoints (unless this iteration's is written), says where and how to go on, waits for
  // every rank; returns 130.
  int StopHere(const std::string& what, const std::vector<std::string>& argv);
  // Evaluates, logs and keeps the result as last_eval(), unless a stop abandoned it
  // (result.interrupted).
  EvalResult RunEval(const std::atomic<bool>* stop);

  // The stages of Step.
  // Forward and backward of the batch; the loss (this rank's) was multiplied by `scale`.
  double ForwardBackward(double scale, const std::atomic<bool>* stop);
  // Waits for the gradient buckets; returns the loss averaged over the ranks.
  double WaitForBuckets(StepTimes& times);
  // A step with a loss scale or in low precision: whether the loss and every gradient are
  // finite on every rank (a vote). When not, the run stops naming the iteration, unless the
  // loss scale is dynamic: then nothing of the step remains (weights, momentum, batch-norm
  // statistics, error-feedback residuals) and the scale backs off.
  bool VoteFinite(double scale, double loss);
  // SGD on the gradients, unscaled by 1 / scale with a loss scaler.
  void Update(double scale);
  // Keeps the batch-norm statistics before forward, for a step that overflows.
  void KeepBuffers();
  void InjectTestFault(bool reduced);

  double Progress(int64_t iteration) const;  // in schedule units
  bool Crossed(double interval, int64_t iteration) const;
  bool is_root() const { return world_.rank == 0; }

  RunConfig config_;
  World world_;
  std::string run_id_;
  std::unique_ptr<BatchSource> train_source_;
  std::unique_ptr<BatchSource> val_source_;
  std::unique_ptr<Net> net_;
  std::unique_ptr<SgdSolver> solver_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<SyncBatchNormReducer> sync_bn_;
  std::unique_ptr<DataParallel> dp_;
  // Loss scaling (precision.loss_scale dynamic or static); null when the loss is not scaled.
  std::unique_ptr<LossScaler> scaler_;
  // The net's buffers as they were before this step's forward (with a dynamic loss scale).
  std::vector<Tensor> kept_buffers_;
  Batch batch_;
  // On a device: the next step's batch, staged (tools/device_feed.h) during this step's backward,
  // and the seconds that took (counted in the next step's data wait).
  StagedBatch staged_;
  double staging_seconds_ = 0;
  int64_t iteration_ = 0;
  int64_t max_iter_ = 0;
  int64_t batches_per_epoch_ = 1;
  double last_loss_ = 0, last_lr_ = 0;
  bool stop_agreed_ = false;
  EvalResult last_eval_;
  // The iteration of the last checkpoint this run wrote, and where (on rank 0).
  int64_t saved_at_ = -1;
  std::string saved_path_;
  std::unique_ptr<TrainReporter> reporter_;
};

}  // namespace cortado
