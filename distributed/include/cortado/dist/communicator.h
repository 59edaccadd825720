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
#pragma once

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

#include "cortado/dist/env.h"
#include "cortado/dist/error.h"
#include "cortado/dist/store.h"
#include "cortado/dist/types.h"

namespace cortado::dist {

// The handle of an asynchronous operation.
class Work {
 public:
  // Blocks until the operation has run; rethrows its error.
  void Wait();
  // True once it has run (then Wait does not block).
  bool Test();

 private:
  friend class Communicator;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "tcp", "mpi", "local"
  const CommOptions& options() const { return options_; }
  // The all-reduce algorithm this communicator would use for a message of `bytes` ("ring",
  // "halving_doubling", "mpi", "local"), after CommOptions and the algo argument.
  virtual std::string AllReduceAlgorithmFor(size_t bytes, Algorithm algo = Algorithm::kAuto) const;
  virtual std::string BroadcastAlgorithmFor(size_t bytes, Algorithm algo = Algorithm::kAuto) const;

  void AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                 Algorithm algo = Algorithm::kAuto);
  void Broadcast(void* data, size_t count, DataType type, int root,
                 Algorithm algo = Algorithm::kAuto);
  void AllGather(const void* input, void* output, size_t count, DataType type);
  void ReduceScatter(const void* input, void* output, size_t count, DataType type, ReduceOp op);
  void Barrier();

  std::shared_ptr<Work> AllReduceAsync(void* data, size_t count, DataType type, ReduceOp op,
                                       Algorithm algo = Algorithm::kAuto);
  std::shared_ptr<Work> BroadcastAsync(void* data, size_t count, DataType type, int root,
                                       Algorithm algo = Algorithm::kAuto);
  std::shared_ptr<Work> AllGatherAsync(const void* input, void* output, size_t count,
                                       DataType type);
  std::shared_ptr<Work> ReduceScatterAsync(const void* input, void* output, size_t count,
                                           DataType type, ReduceOp op);
  std::shared_ptr<Work> BarrierAsync();

 protected:
  explicit Communicator(CommOptions options);
  // Backends implement the operations; the base class orders, queues and checks them.
  virtual void DoAllReduce(void* data, size_t count, DataType type, ReduceOp op,
                           Algorithm algo) = 0;
  virtual void DoBroadcast(void* data, size_t count, DataType type, int root, Algorithm algo) = 0;
  virtual void DoAllGather(const void* input, void* output, size_t count, DataType type) = 0;
  virtual void DoReduceScatter(const void* input, void* output, size_t count, DataType type,
                               ReduceOp op) = 0;
  virtual void DoBarrier() = 0;
  // Stops the worker thread; backends call it first thing in their destructor.
  void StopWorker();

 private:
  void RunOrdered(const std::function<void()>& op);
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

// Builds the communicator of options.backend (the MPI backend ignores the rendezvous fields).
std::unique_ptr<Communicator> CreateCommunicator(const CommConfig& config);
// DiscoverLaunchInfo() + CommOptions::FromEnv() + CreateCommunicator.
std::unique_ptr<Communicator> CreateCommunicatorFromEnv(uint64_t fingerprint = 0);
// True when this build has the MPI backend.
bool HasMpiBackend();

}  // namespace cortado::dist
