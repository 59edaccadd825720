// Trainer: the training loop behind `cortado train` (and the pieces `cortado eval` and
// `cortado bench train` share): data source -> net forward/backward -> gradient all-reduce ->
// SGD step, with logging, metrics, evaluation, checkpoints, resume and clean interruption.
//
// Data parallelism: with W ranks (tools/world.h) each rank reads its shard of every epoch
// (rank r of W), the DataParallel glue (engine/data_parallel.h) averages gradients in buckets
// overlapped with backward, synchronized batch norm combines statistics over its group, and
// evaluation sums every rank's counts. Rank 0 is the only one that reads a checkpoint to
// resume (everyone else receives rank 0's state), writes checkpoints, metrics and the progress
// bar; all ranks stop together (Ctrl-C, --stop-at-iter) at the same step.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch_source.h"
#include "engine/checkpoint.h"
#include "engine/data_parallel.h"
#include "engine/loss_scaler.h"
#include "engine/net.h"
#include "engine/solver.h"
#include "engine/sync_batch_norm.h"
#include "engine/trace.h"
#include "tools/metrics.h"
#include "tools/run_config.h"
#include "tools/run_folder.h"
#include "tools/world.h"

namespace cortado {

// Builds the config's model for inputs of the given sample shape {C, H, W}.
NetSpec MakeNetSpec(const RunConfig& config, const Shape& sample_shape, int64_t num_classes,
                    int64_t batch_size);

// Points the net's inputs at the batch (no copy: the net reads them during this step only); an
// f64 net gets a converted copy. Throws when the images do not fit the net's input.
void FeedBatch(Net& net, const Batch& batch);

struct EvalResult {
  double top1 = 0, top5 = 0, loss = 0;  // fractions in [0, 1]; mean loss per image
  int64_t images = 0;
  int64_t skipped = 0;  // unreadable records left out (the source names them in warnings)
};

// Runs the net in test phase over one pass of `source` and restores the previous phase. With a
// communicator, every rank passes its own shard and all get the totals of all shards (counts
// of correct images are integers, so they equal a one-process evaluation exactly), skipped
// records included.
EvalResult Evaluate(Net& net, BatchSource& source, dist::Communicator* comm = nullptr);

// The net as a table (layer, type, output shape, parameters), columns as wide as their
// longest entry, and the total.
std::string NetTable(Net& net);

// NetTable of a config whose data is not on this machine (inspect, a dry run): the net built
// from the model section's num_classes and the input the data section describes (LMDB: 3 x
// crop x crop; synthetic: its shape), and a line that says so. Throws when they do not say
// enough (no num_classes; IDX files, whose header holds the image size).
std::string NetTableWithoutData(const RunConfig& config);

// What the data section yields: records in data.train and data.val, and how an epoch of this
// rank's `train` source is made of them ("47 records; an epoch is 5 batches of 8 = 40 samples,
// drop_last leaves 7 out").
std::string DataSummary(const RunConfig& config, const BatchSource& train);

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

class Trainer : public CheckpointState {
 public:
  // Builds sources (this rank's shard), net, solver and, with several ranks, the data-parallel
  // glue; checks that every rank runs the same job. Collective when world.size > 1.
  explicit Trainer(RunConfig config, World world = World{});
  ~Trainer() override;

  // Trains to the end (returns 0) or until `stop` becomes true on any rank or stop_at is
  // reached (checkpoint, prints the command that resumes, returns 130). Rank 0's metrics file
  // gets a "start" or "resume" event first.
  int Run(const TrainOptions& options, const std::atomic<bool>* stop = nullptr);
  // The folder and metrics file a run with these options writes.
  tools::RunFolder RunFolderOf(const TrainOptions& options) const;

  // Puts every rank in the same starting state: rank 0 resumes from `resume` ("", "auto" or a
  // path) and sends its weights, buffers, solver state and position to the others. With a
  // folder, rank 0 also checks that this run may use it (tools/run_folder.h); every rank gets
  // the same error when it may not.
  void Start(const std::string& resume, const tools::RunFolder* folder = nullptr);
  // One training step on the next batch. With several ranks, a `stop` that is true once
  // forward has run is this rank's vote to stop after the step (see stop_agreed()).
  StepTimes Step(const std::atomic<bool>* stop = nullptr);
  // True when some rank voted to stop during the last step.
  bool stop_agreed() const { return stop_agreed_; }

  Net& net() { return *net_; }
  int64_t iteration() const { return iteration_; }
  int64_t max_iter() const { return max_iter_; }
  int64_t global_batch() const { return config_.data.batch_size * world_.size; }
  const World& world() const { return world_; }
  const EvalResult& last_eval() const { return last_eval_; }
  double last_loss() const { return last_loss_; }
  // The loss scaler (null when precision.loss_scale is 1).
  const LossScaler* loss_scaler() const { return scaler_.get(); }
  // The id every checkpoint of this run carries: new for a fresh start, the checkpoint's on
  // resume.
  const std::string& run_id() const { return run_id_; }

  // Checkpoint state of the run itself: position in the data, seed, config, world shape.
  void SaveState(Checkpoint& checkpoint) const override;
  void LoadState(const Checkpoint& checkpoint, const std::string& path) override;

 private:
  std::string JobDescription() const;
  Checkpoint CollectState() const;
  void LoadAllState(const Checkpoint& checkpoint, const std::string& path);
  // True when it loaded a checkpoint ("auto" in a folder without one starts fresh).
  bool Resume(const std::string& what);
  // A fresh start with model.weights: rank 0 initializes the net from that file.
  void InitFromWeights();
  void WarnAboutConfigChanges(const Checkpoint& checkpoint, const std::string& path) const;
  // Every rank must call it (error feedback gathers the ranks' residuals); rank 0 writes the
  // checkpoint and returns its path, the others return "".
  std::string SaveCheckpointNow();
  void LoadFeedback(const Checkpoint& checkpoint, const std::string& path);
  void StopHere(const char* why, const std::vector<std::string>& argv);
  void LogInterval(int64_t replaced_records);
  // Corrupt training records replaced so far, summed over the ranks (collective).
  int64_t ReplacedRecords() const;
  void RunEval();
  // The update of a mixed-precision step (or one with a loss scale) whose loss was multiplied by
  // `scale` (1 without a scaler): when the loss or any gradient is not finite on any rank (a
  // vote), skipped on every rank with the scale backed off under a dynamic scale, else the run
  // stops naming the iteration; otherwise SGD on the unscaled gradients.
  void UpdateScaled(double scale, double loss);
  // Keeps the batch-norm statistics before forward, for a step that overflows.
  void KeepBuffers();
  void InjectTestFault(bool reduced);
  void TraceStep(const StepTimes& times, Trace::Clock::time_point t0,
                 Trace::Clock::time_point t_update0, Trace::Clock::time_point t_update1);
  void FinishTrace();
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
  // Error feedback: every rank's residual block, as last gathered or loaded (rank r's at r).
  std::vector<Tensor> feedback_;
  // The net's buffers as they were before this step's forward (with a dynamic loss scale).
  std::vector<Tensor> kept_buffers_;
  Batch batch_;
  int64_t iteration_ = 0;
  int64_t max_iter_ = 0;
  int64_t batches_per_epoch_ = 1;
  double last_loss_ = 0, last_lr_ = 0;
  bool stop_agreed_ = false;
  EvalResult last_eval_;
  IntervalStats interval_;
  MetricsFile metrics_;
  ProgressBar progress_{false};
  int64_t first_iteration_ = 0;
  // Tracing (--trace): the trace, where it goes, and the last iteration it records.
  std::unique_ptr<Trace> trace_;
  std::string trace_path_;
  int64_t trace_until_ = 0;
};

}  // namespace cortado
