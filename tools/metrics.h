// What a training run reports while it runs: the JSON-lines metrics file (--metrics), the live
// progress bar on a terminal, and the per-interval step accounting behind the log lines.
// Only rank 0 of a data-parallel job writes them.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace cortado {

// Where one training step's time went, in seconds.
struct StepTimes {
  double data_wait = 0;  // waiting for the batch
  double compute = 0;    // forward, backward (including synchronized batch norm) and update
  double comm_wait = 0;  // waiting for gradient buckets after backward (exposed communication)
  double sync_bn = 0;    // synchronized batch-norm all-reduces (part of compute)
  // Not wall time: what the gradient buckets cost the communicator's worker thread (CPU seconds,
  // total and the kernel's user/system split) and how often it slept waiting for the network.
  double comm_cpu = 0;
  double comm_user = 0;
  double comm_system = 0;
  double comm_wakeups = 0;
  double Total() const { return data_wait + compute + comm_wait; }
};

// Sums over a log interval.
struct IntervalStats {
  int64_t steps = 0;
  double loss_sum = 0;
  StepTimes time;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  void Add(double loss, const StepTimes& t);
  double Seconds() const;  // wall time since start
  void Reset() { *this = IntervalStats{}; }
};

// JSON text with every floating-point number in its shortest round-trip form (0.4, not
// 0.40000000000000002). nlohmann::json's own dump uses Grisu2, which is short for most values
// but not all (0.014226513999999999 for 0.014226514), so numbers go through std::to_chars.
std::string DumpShortest(const nlohmann::ordered_json& value);

// One JSON object per line (DumpShortest), flushed per record so a crash loses nothing
// written; every record gets "time", Unix seconds with milliseconds, after its "event".
class MetricsFile {
 public:
  // path "": no file. append: a resumed run continues the file; otherwise it starts afresh.
  void Open(const std::string& path, bool append);
  // record must start with "event".
  void Write(const nlohmann::ordered_json& record);
  bool is_open() const { return out_.is_open(); }

 private:
  std::string path_;
  std::ofstream out_;
};

// A one-line bar on stdout ("[#####.....]  42.0%  iter 420/1000  loss 0.53  ETA 1:02"),
// redrawn at most four times a second; log lines go to stderr, so Clear() before each.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void Update(int64_t iteration, int64_t max_iter, int64_t first_iteration, double loss);
  void Clear();

 private:
  bool enabled_;
  std::chrono::steady_clock::time_point last_draw_{};
  std::chrono::steady_clock::time_point run_start_ = std::chrono::steady_clock::now();
};

// 16 hex digits identifying a resolved config (64-bit FNV-1a of its text): the metrics file's
// start and resume events carry it, so the parts of a resumed run can be checked to match.
std::string ConfigHash(const std::string& text);

// "1:02" or "3:04:05"; "?" when unknown.
std::string FormatDuration(double seconds);
// A number with `digits` decimals, for log lines.
std::string Fixed(double v, int digits);

}  // namespace cortado
