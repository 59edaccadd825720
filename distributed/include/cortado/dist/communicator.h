// A communicator: the ranks of one job and the collectives between them. Buffers are host
// memory, `count` is in elements of `type`; in-place where noted. Every rank must call the same
// collectives in the same order with the same count, type, op and root (the operations are
// numbered; a rank that skips one makes the others fail at the deadline, naming it).
//
//   AllReduce      data[count]             -> every rank gets op over ranks (in place)
//   Broadcast      data[count] on root     -> every rank
//   AllGather      input[count]            -> output[size() * count], rank r's at r * count
//                  (input may be output + rank() * count)
//   ReduceScatter  input[size() * count]   -> output[count] = op over ranks of slice rank()
//   Barrier        returns once every rank has entered it
//   AllReduceCompressed  f32 data[count], sum or average, travelling in a codec (codec.h)
//   Split          (color, key) -> a new communicator of the ranks that passed the same color
//
// Results are bitwise identical on every rank for every algorithm: each element's final value is
// computed once and copied, or computed identically (operands in rank order).
//
// Deadlines: each operation has CommOptions::timeout. A dead peer fails the operation on every
// rank within seconds, naming the dead rank and the operation; a stalled peer fails it at the
// deadline, naming the ranks that had not arrived. After a failure the communicator is broken:
// every later call throws (peers are told, so none of them hangs either).
//
// Threads: the synchronous calls and Work::Wait may be called from any one thread at a time.
// The ...Async forms queue the operation for the communicator's worker thread and return a
// handle; queued and synchronous operations run in the order they were issued.
//
// Registered memory: AllocateRegistered hands out host memory that the transport registered when
// it was allocated, so collectives on buffers inside it skip registration (the trainer keeps its
// gradients there). Over UCX, with every rank on one host, it is shared memory the other ranks
// map: a large all-reduce whose buffer lies in such memory on every rank runs kDirect, each rank
// reducing its slice by loading the other ranks' buffers and storing the result into all of
// them, with no message carrying data (the same sums in the same order as the ring, so the
// results are bitwise the ring's).
//
// Split builds a child communicator that owns its own connections (TCP) or MPI communicator,
// worker thread and operation numbering, so its operations never queue behind the parent's:
// one thread may run child operations while the parent's worker runs queued parent ones. Parent
// and child are independent objects: destroy them in any order (a child may outlive its parent).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cortado/dist/codec.h"
#include "cortado/dist/env.h"
#include "cortado/dist/error.h"
#include "cortado/dist/store.h"
#include "cortado/dist/types.h"

namespace cortado::dist {

// CPU time one thread spent, in seconds: total from its CPU clock (CLOCK_THREAD_CPUTIME_ID,
// exact), and the kernel's split of it into user and system time (getrusage(RUSAGE_THREAD); the
// kernel apportions the exact total by its tick samples, so the split of a span shorter than a few
// ticks is coarse; the two add up to about total_s). System time is the thread's own system calls
// (sends, receives, waits); interrupt and softirq work is charged to whichever thread it
// interrupted.
struct ThreadCpu {
  double total_s = 0;
  double user_s = 0;
  double system_s = 0;
  ThreadCpu& operator+=(const ThreadCpu& o) {
    total_s += o.total_s;
    user_s += o.user_s;
    system_s += o.system_s;
    return *this;
  }
};
// The calling thread's CPU time so far (since it started).
ThreadCpu CurrentThreadCpu();

// The handle of an asynchronous operation.
class Work {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // Blocks until the operation has run; rethrows its error.
  void Wait();
  // True once it has run (then Wait does not block).
  bool Test();

  // When the operation was queued (set before the ...Async call returns), when the worker thread
  // began running it (after the operations issued before it had finished), and when it finished
  // (successfully or not). started_at and finished_at are valid once Test() is true or Wait()
  // returned (or threw); before that they are the clock's epoch. For traces (Chrome trace
  // events): queued_at..started_at is time spent waiting behind earlier operations.
  TimePoint queued_at() const;
  TimePoint started_at() const;
  TimePoint finished_at() const;
  // CPU time the worker thread spent running the operation (started_at..finished_at): the
  // communication's own cost on this rank, beside the wall time it took. Valid like finished_at;
  // zero before. Sleeps while the network drains cost none of it; polling, copies, reductions and
  // the system calls do. (The transport's progress thread, busy only between operations, and
  // the kernel's network path in softirq are not in it.)
  ThreadCpu cpu() const;
  // How many times the worker thread slept in the kernel waiting for the network during the
  // operation (Transport::WaitSleeps): each is a wake-up. Zero for backends that do not count
  // (MPI, a world of one). Valid like finished_at.
  uint64_t wakeups() const;

 private:
  friend class Communicator;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  TimePoint queued_at_{};
  TimePoint started_at_{};
  TimePoint finished_at_{};
  ThreadCpu cpu_{};
  uint64_t wakeups_ = 0;
};

// How AllReduceCompressed encodes what travels.
struct Compression {
  CodecKind codec = CodecKind::kF32;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;  // kStochastic's random stream: vary it per step and bucket
  // Error feedback (or null): count floats, this rank's own. On entry it is added to the
  // (scaled) data before anything is encoded; on return it holds what this rank's encodings
  // lost, so the ranks' residuals sum to (exact sum - result), up to fp32 rounding, and adding
  // them to the next call's data re-injects what this one dropped.
  float* residual = nullptr;
};

// Memory from Communicator::AllocateRegistered: size() bytes at data(), page-aligned and
// uninitialized. Freed when destroyed, which may be after the communicator is gone (from any
// thread, but not while an operation on it runs).
class RegisteredMemory {
 public:
  virtual ~RegisteredMemory() = default;
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 protected:
  RegisteredMemory(void* data, size_t size) : data_(data), size_(size) {}

 private:
  void* data_;
  size_t size_;
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // What carries the collectives: "tcp" or "ucx" (the transport under Cortado's own), "mpi",
  // or "local" (a world of one).
  virtual const char* backend() const = 0;
  const CommOptions& options() const { return options_; }
  // The all-reduce algorithm this communicator would use for a message of `bytes` ("ring",
  // "halving_doubling", "direct", "mpi", "local"), after CommOptions and the algo argument; with
  // `data`, for a buffer there, assuming every rank's buffer is of the same kind (plain or
  // registered memory).
  virtual std::string AllReduceAlgorithmFor(size_t bytes, Algorithm algo = Algorithm::kAuto,
                                            const void* data = nullptr) const;
  virtual std::string BroadcastAlgorithmFor(size_t bytes, Algorithm algo = Algorithm::kAuto) const;

  void AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                 Algorithm algo = Algorithm::kAuto);
  void Broadcast(void* data, size_t count, DataType type, int root,
                 Algorithm algo = Algorithm::kAuto);
  void AllGather(const void* input, void* output, size_t count, DataType type);
  void ReduceScatter(const void* input, void* output, size_t count, DataType type, ReduceOp op);
  void Barrier();
  // The compressed ring all-reduce of f32 data (op kSum or kAvg). Every rank first computes
  // x = data * s + residual (s = 1/W for kAvg, so a sum of W values in a narrow format cannot
  // overflow where the average does not; 1 for kSum). Reduce-scatter: each hop sends its
  // partial sums encoded, and the receiver decodes and accumulates them in fp32 and re-encodes
  // the new partial sum for the next hop. The rank that completes a segment encodes it once;
  // every rank (that one included) decodes those bytes, so results are bitwise identical on all
  // ranks. Bytes on the wire: 2 (W-1)/W x count x CodecBits/8 per rank. With codec kF32 this is
  // AllReduce (residual untouched); with one rank nothing travels and data is only scaled.
  void AllReduceCompressed(float* data, size_t count, ReduceOp op, const Compression& compression);

  std::shared_ptr<Work> AllReduceAsync(void* data, size_t count, DataType type, ReduceOp op,
                                       Algorithm algo = Algorithm::kAuto);
  std::shared_ptr<Work> BroadcastAsync(void* data, size_t count, DataType type, int root,
                                       Algorithm algo = Algorithm::kAuto);
  std::shared_ptr<Work> AllGatherAsync(const void* input, void* output, size_t count,
                                       DataType type);
  std::shared_ptr<Work> ReduceScatterAsync(const void* input, void* output, size_t count,
                                           DataType type, ReduceOp op);
  std::shared_ptr<Work> BarrierAsync();
  std::shared_ptr<Work> AllReduceCompressedAsync(float* data, size_t count, ReduceOp op,
                                                 const Compression& compression);

  // bytes of host memory registered with this communicator's transport (see the file comment);
  // any thread, at any time (it is not an operation: nothing is sent). Backends without
  // registration (MPI, a world of one) return plain page-aligned memory. Throws kSystem.
  virtual std::unique_ptr<RegisteredMemory> AllocateRegistered(size_t bytes);

  // A collective: every rank of this communicator must call it, in the same order as its other
  // operations (it waits for queued asynchronous work first, like the synchronous calls). Ranks
  // that pass the same color form a new communicator, ranked by (key, rank in this one), as
  // MPI_Comm_split and ncclCommSplit do. color must be >= 0 (every rank gets a communicator):
  // a negative color throws kInvalidArgument before anything is communicated. The result is of
  // the same backend, with this communicator's options (over TCP a group of one is a "local"
  // communicator, with no sockets). A peer that dies or stalls during the exchange of colors
  // breaks this communicator like any operation; a failure while the child connects throws
  // from Split.
  virtual std::unique_ptr<Communicator> Split(int color, int key);

 protected:
  explicit Communicator(CommOptions options);
  // The algorithm a collective of `bytes` runs with (never kAuto), for backends with a choice:
  // an enum, so the per-operation path builds no string.
  Algorithm ResolveAllReduce(size_t bytes, Algorithm algo) const;
  Algorithm ResolveBroadcast(size_t bytes, Algorithm algo) const;
  // Backends implement the operations; the base class orders, queues and checks them.
  virtual void DoAllReduce(void* data, size_t count, DataType type, ReduceOp op,
                           Algorithm algo) = 0;
  virtual void DoBroadcast(void* data, size_t count, DataType type, int root, Algorithm algo) = 0;
  virtual void DoAllGather(const void* input, void* output, size_t count, DataType type) = 0;
  virtual void DoReduceScatter(const void* input, void* output, size_t count, DataType type,
                               ReduceOp op) = 0;
  virtual void DoBarrier() = 0;
  // count > 0, size() > 1, op kSum or kAvg, codec not kF32 (the base class handles the rest).
  virtual void DoAllReduceCompressed(float* data, size_t count, ReduceOp op,
                                     const Compression& compression) = 0;
  // Runs the split (arguments checked, in issue order) and builds the child communicator.
  virtual std::unique_ptr<Communicator> DoSplit(int color, int key) = 0;
  // Stops the worker thread; backends call it first thing in their destructor.
  void StopWorker();
  // Times the backend's waits have slept for the network so far (Transport::WaitSleeps); 0 where
  // the backend does not count. Read by the worker thread around each queued operation.
  virtual uint64_t WaitSleeps() const { return 0; }

 private:
  // Runs op on the calling thread once everything queued before it has run. A template, not a
  // std::function: the blocking collectives' small-message path then allocates nothing.
  template <typename Op>
  void RunOrdered(Op&& op) {
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      idle_cv_.wait(lock, [&] { return queue_.empty() && !worker_busy_; });
    }
    std::lock_guard<std::mutex> order(order_mu_);
    op();
  }
  void RunCompressed(float* data, size_t count, ReduceOp op, const Compression& compression);
  std::shared_ptr<Work> Enqueue(std::function<void()> op);
  void WorkerLoop();

  CommOptions options_;
  std::mutex order_mu_;  // held while an operation runs: one at a time, in issue order
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Work>>> queue_;
  bool worker_busy_ = false;
  bool stop_ = false;
  std::thread worker_;
};

struct CommConfig {
  int rank = 0;
  int world_size = 1;
  // Rendezvous: either a store shared by the ranks (e.g. an InMemoryStore for threads) ...
  Store* store = nullptr;
  std::string store_prefix;  // namespaces the keys when several communicators share a store
  // ... or rank 0 serves a TcpStore at master_addr:master_port (store_fd: an inherited socket).
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  int store_fd = -1;
  std::string job_token;     // required for world size > 1 with the TCP store
  uint64_t fingerprint = 0;  // must match on every rank (e.g. a hash of the trainer's config)
  CommOptions options;
};

// The rendezvous fields of a CommConfig from a discovered launch (rank, size, rank 0's store,
// the job token), with these options.
CommConfig CommConfigFor(const LaunchInfo& info, const CommOptions& options);
// Builds the communicator of options.backend (the MPI backend ignores the rendezvous fields).
std::unique_ptr<Communicator> CreateCommunicator(const CommConfig& config);
// DiscoverLaunchInfo() + CommOptions::FromEnv() + CreateCommunicator.
std::unique_ptr<Communicator> CreateCommunicatorFromEnv(uint64_t fingerprint = 0);
// True when this build has the MPI backend.
bool HasMpiBackend();

}  // namespace cortado::dist
