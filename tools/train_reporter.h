// TrainReporter: what a training run tells its user while it runs, kept apart from the training
// itself: the start-up banner, the log line of every interval, evaluations, checkpoints and
// stops, the metrics file (--metrics), the live progress bar and the Chrome trace (--trace).
//
// It reads the trainer's state and changes none of it but the trace hooks. Rank 0 writes every line
// and record; every rank calls the same methods in the same order, because two of them are
// collective: the interval line sums the corrupt records every rank replaced, and each rank writes
// its own trace. The trainer owns its reporter; bench train, which calls Trainer::Step alone,
// leaves it closed, and then it reports nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/trace.h"
#include "tools/evaluate.h"
#include "tools/metrics.h"

namespace cortado {

class Trainer;
struct TrainOptions;

class TrainReporter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit TrainReporter(Trainer& trainer);
  ~TrainReporter();

  // At the start of Trainer::Run, after the starting state is in place: rank 0 opens the
  // progress bar and the metrics file (a "start" or "resume" event); every rank starts its
  // trace (a path it cannot write stops here, before training); then the banner, and the first
  // interval starts.
  void Open(const TrainOptions& options);
  // After each step: the interval's sums, its log line and metrics record every
  // config.log_interval steps and at the last (collective then), the progress bar.
  void Step(const StepTimes& times);
  // An evaluation that ran to its end: its log line and metrics record.
  void Eval(const EvalResult& result, double seconds);
  void Saved(const std::string& path);
  // A mixed-precision step that overflowed and was skipped.
  void Overflow(int64_t iteration, double loss, double scale, double new_scale);
  // Where a stopped run is: `what` ("interrupted at iteration 12"), the checkpoint, and the
  // command that resumes it, or, once training is complete, the one that evaluates it.
  void Stopped(const std::string& what, const std::string& path,
               const std::vector<std::string>& argv);
  // The end of training: the data loader's cost and the corrupt records met.
  void Finish(Clock::time_point run_start);

  // Tracing: whether this iteration is traced, the step's events (after its update), and the
  // end of the trace (written to its file; idempotent).
  bool tracing(int64_t iteration) const { return trace_ && iteration < trace_until_; }
  void TraceStep(const StepTimes& times, Clock::time_point t0, Clock::time_point t_update0,
                 Clock::time_point t_update1);
  void FinishTrace();

  // Clears the progress bar before a line that others log.
  void Clear() { progress_.Clear(); }

 private:
  // The start-up lines: model and data (per rank and in all), precision, batch and learning
  // rate, gradient buckets and codecs, the schedule.
  void Banner() const;
  void LogInterval(int64_t replaced_records);
  void WriteStartEvent(const TrainOptions& options);
  void BannerDataParallel() const;
  bool is_root() const;

  Trainer& trainer_;
  IntervalStats interval_;
  MetricsFile metrics_;
  ProgressBar progress_{false};
  int64_t first_iteration_ = 0;
  std::unique_ptr<Trace> trace_;
  std::string trace_path_;
  int64_t trace_until_ = 0;
};

}  // namespace cortado
