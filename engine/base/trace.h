// Trace: a Chrome trace of one rank's training, in the Trace Event Format that chrome://tracing
// and Perfetto open (a JSON object with a "traceEvents" array).
//
// Events are complete spans ("ph": "X") with begin and duration in microseconds of the steady
// clock (shared by the processes of one machine), on a few named tracks (Chrome's threads) of
// one process named after the rank, so the files of several ranks can be loaded together and
// line up. Tracks:
//   compute    forward and backward per layer, data wait, the solver's wait, the update
//   gradients  each gradient bucket's all-reduce, from enqueue to done
//   batchnorm  synchronized batch-norm all-reduces
// Threads: events are added from one thread (the training thread records the communication
// spans after the fact from the work's timestamps), so there is no lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cortado {

enum class TraceTrack : int { kCompute = 0, kGradients = 1, kBatchNorm = 2 };

class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  using Args = std::vector<std::pair<std::string, double>>;

  explicit Trace(int rank);

  // A span [begin, end) named `name` in `category` ("forward", "backward", "comm", ...).
  void Add(TraceTrack track, std::string name, const char* category, Clock::time_point begin,
           Clock::time_point end, Args args = {});
  size_t size() const { return events_.size(); }

  // Writes the trace to path atomically (temporary file, rename); throws naming the path.
  void Write(const std::string& path) const;

 private:
  struct Event {
    TraceTrack track;
    std::string name;
    const char* category;
    double begin_us, duration_us;
    Args args;
  };
  int rank_;
  Clock::time_point origin_;
  std::vector<Event> events_;
};

// Throws naming the path when a trace could not be written there (its folder is created).
void CheckTraceWritable(const std::string& path);

// The file a rank writes for --trace PATH: PATH itself in a single process, else PATH with
// ".rank<r>" before its extension ("t.json" -> "t.rank1.json").
std::string TracePathForRank(const std::string& path, int rank, int world_size);

}  // namespace cortado
