// Trainer: the training loop behind `cortado train` (and the pieces `cortado eval` and
// `cortado bench train` share): data source -> net forward/backward -> SGD step, with
// logging, metrics (JSON lines), evaluation, checkpoints, resume and clean interruption.
#pragma once

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "data/batch_source.h"
#include "engine/checkpoint.h"
#include "engine/net.h"
#include "engine/solver.h"
#include "tools/run_config.h"

namespace cortado {

// Builds the config's model for inputs of the given sample shape {C, H, W}.
NetSpec MakeNetSpec(const RunConfig& config, const Shape& sample_shape, int64_t num_classes,
                    int64_t batch_size);

struct EvalResult {
  double top1 = 0, top5 = 0, loss = 0;
  int64_t images = 0;
};

// Runs the net in test phase over one pass of `source`; restores the previous phase.
EvalResult Evaluate(Net& net, BatchSource& source);

// Copies the net's parameters and buffers from a checkpoint; throws naming the first
// parameter that is missing or has another shape.
void LoadWeights(Net& net, const Checkpoint& checkpoint, const std::string& path);

struct TrainOptions {
  std::string resume;        // "", "auto" or a checkpoint path
  std::string metrics_path;  // JSON lines; "" for none
  bool progress_bar = false; // live bar (when stdout is a terminal)
  int64_t stop_at = 0;       // > 0: stop there as if interrupted (for job time limits, tests)
};

class Trainer {
 public:
  explicit Trainer(RunConfig config);
  // Trains to the end (returns 0) or until `stop` becomes true (checkpoint, returns 130).
  int Run(const TrainOptions& options, const std::atomic<bool>* stop = nullptr);

  Net& net() { return *net_; }
  int64_t iteration() const { return iteration_; }
  int64_t max_iter() const { return max_iter_; }
  const EvalResult& last_eval() const { return last_eval_; }

 private:
  void Resume(const std::string& what);
  std::string SaveCheckpointNow();
  void TrainStep();
  void Log(double interval_loss, double interval_images, double interval_seconds,
           double interval_wait, bool to_log);
  void RunEval();
  double Progress(int64_t iteration) const;  // in schedule units
  bool Crossed(double interval, int64_t iteration) const;
  void WriteMetric(const std::string& json);
  void ClearProgressBar();

  RunConfig config_;
  std::unique_ptr<BatchSource> train_source_;
  std::unique_ptr<BatchSource> val_source_;
  std::unique_ptr<Net> net_;
  std::unique_ptr<SgdSolver> solver_;
  std::unique_ptr<LrSchedule> schedule_;
  Batch batch_;
  int64_t iteration_ = 0;
  int64_t max_iter_ = 0;
  int64_t batches_per_epoch_ = 1;
  double last_loss_ = 0, last_lr_ = 0;
  double wait_seconds_ = 0;
  EvalResult last_eval_;
  std::ofstream metrics_;
  bool progress_bar_ = false;
};

}  // namespace cortado
