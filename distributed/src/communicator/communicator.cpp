// The communicator base: argument checks, issue order, the asynchronous queue and its worker
// thread; and the factory that picks a backend.
#include "cortado/dist/communicator.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "communicator/backends.h"

namespace cortado::dist {

void Work::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool Work::Test() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Work::TimePoint Work::queued_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_at_;
}

Work::TimePoint Work::started_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_at_;
}

Work::TimePoint Work::finished_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_at_;
}

ThreadCpu Work::cpu() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cpu_;
}

uint64_t Work::wakeups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wakeups_;
}

ThreadCpu CurrentThreadCpu() {
  ThreadCpu t;
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) {
    t.total_s = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  rusage ru{};
  if (::getrusage(RUSAGE_THREAD, &ru) == 0) {
    auto seconds = [](const timeval& v) {
      return static_cast<double>(v.tv_sec) + 1e-6 * static_cast<double>(v.tv_usec);
    };
    t.user_s = seconds(ru.ru_utime);
    t.system_s = seconds(ru.ru_stime);
  }
  return t;
}

Communicator::Communicator(CommOptions options) : options_(std::move(options)) {}

Communicator::~Communicator() { StopWorker(); }

void Communicator::StopWorker() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

Algorithm Communicator::ResolveAllReduce(size_t bytes, Algorithm algo) const {
  if (algo == Algorithm::kAuto) algo = options_.allreduce_algorithm;
  if (algo == Algorithm::kAuto) {
    algo = bytes <= options_.allreduce_small_bytes ? Algorithm::kHalvingDoubling : Algorithm::kRing;
  }
  return algo;
}

Algorithm Communicator::ResolveBroadcast(size_t bytes, Algorithm algo) const {
  if (algo == Algorithm::kAuto) {
    algo = bytes <= options_.broadcast_small_bytes ? Algorithm::kTree : Algorithm::kRing;
  }
  return algo;
}

std::string Communicator::AllReduceAlgorithmFor(size_t bytes, Algorithm algo, const void*) const {
  if (size() == 1) return "local";
  return AlgorithmName(ResolveAllReduce(bytes, algo));
}

std::string Communicator::BroadcastAlgorithmFor(size_t bytes, Algorithm algo) const {
  if (size() == 1) return "local";
  return AlgorithmName(ResolveBroadcast(bytes, algo));
}

namespace {

// Page-aligned host memory, for backends that register nothing.
class PlainMemory final : public RegisteredMemory {
 public:
  PlainMemory(void* data, size_t size) : RegisteredMemory(data, size) {}
  ~PlainMemory() override { std::free(data()); }
};

}  // namespace

std::unique_ptr<RegisteredMemory> Communicator::AllocateRegistered(size_t bytes) {
  constexpr size_t kPage = 4096;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, rounded);
  if (p == nullptr) Fail(ErrorKind::kSystem, "out of memory allocating ", bytes, " bytes");
  return std::make_unique<PlainMemory>(p, bytes);
}

namespace {

void CheckBuffer(const char* op, const void* p, size_t count, size_t multiple, DataType type) {
  if (count > std::numeric_limits<size_t>::max() / multiple / DataTypeSize(type)) {
    throw Error(ErrorKind::kInvalidArgument, StrCat(op, ": count ", count, " is too large"), -1,
                op);
  }
  if (count > 0 && p == nullptr) {
    throw Error(ErrorKind::kInvalidArgument, StrCat(op, ": null buffer for ", count, " elements"),
                -1, op);
  }
}

}  // namespace

std::shared_ptr<Work> Communicator::Enqueue(std::function<void()> op) {
  auto work = std::make_shared<Work>();
  work->queued_at_ = std::chrono::steady_clock::now();  // not shared with the worker yet
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stop_) {
      throw Error(ErrorKind::kInvalidArgument, "communicator is shutting down");
    }
    queue_.emplace_back(std::move(op), work);
    if (!worker_.joinable()) worker_ = std::thread([this] { WorkerLoop(); });
  }
  queue_cv_.notify_one();
  return work;
}

void Communicator::WorkerLoop() {
  for (;;) {
    std::pair<std::function<void()>, std::shared_ptr<Work>> item;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      item = std::move(queue_.front());
      queue_.pop_front();
      worker_busy_ = true;
    }
    std::exception_ptr error;
    Work::TimePoint started, finished;
    ThreadCpu cpu0, cpu1;
    uint64_t sleeps0 = 0, sleeps1 = 0;
    {
      std::lock_guard<std::mutex> order(order_mu_);
      started = std::chrono::steady_clock::now();
      cpu0 = CurrentThreadCpu();
      sleeps0 = WaitSleeps();
      try {
        item.first();
      } catch (...) {
        error = std::current_exception();
      }
      cpu1 = CurrentThreadCpu();
      sleeps1 = WaitSleeps();
      finished = std::chrono::steady_clock::now();
    }
    {
      std::lock_guard<std::mutex> lock(item.second->mu_);
      item.second->done_ = true;
      item.second->error_ = error;
      item.second->started_at_ = started;
      item.second->finished_at_ = finished;
      item.second->cpu_ = ThreadCpu{cpu1.total_s - cpu0.total_s, cpu1.user_s - cpu0.user_s,
                                    cpu1.system_s - cpu0.system_s};
      item.second->wakeups_ = sleeps1 - sleeps0;
    }
    item.second->cv_.notify_all();
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      worker_busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

namespace {

// The checks each collective makes before anything is queued or sent, shared by its
// synchronous and asynchronous entry points.
void CheckAllReduce(const void* data, size_t count, DataType type, Algorithm algo) {
  CheckBuffer("allreduce", data, count, 1, type);
  if (algo == Algorithm::kTree) {
    throw Error(ErrorKind::kInvalidArgument,
                "allreduce: algorithm 'tree' is for broadcast (all-reduce: auto, ring, "
                "halving_doubling, direct)",
                -1, "allreduce");
  }
}

void CheckBroadcast(const void* data, size_t count, DataType type, int root, Algorithm algo,
                    int size) {
  CheckBuffer("broadcast", data, count, 1, type);
  if (algo == Algorithm::kDirect) {
    throw Error(ErrorKind::kInvalidArgument,
                "broadcast: algorithm 'direct' is for all-reduce (broadcast: auto, ring, tree)", -1,
                "broadcast");
  }
  if (root < 0 || root >= size) {
    throw Error(ErrorKind::kInvalidArgument,
                StrCat("broadcast: root ", root, " is outside the world of ", size), -1,
                "broadcast");
  }
}

void CheckAllGather(const void* input, const void* output, size_t count, DataType type, int size) {
  CheckBuffer("allgather", input, count, 1, type);
  CheckBuffer("allgather", output, count, static_cast<size_t>(size), type);
}

void CheckReduceScatter(const void* input, const void* output, size_t count, DataType type,
                        int size) {
  CheckBuffer("reducescatter", input, count, static_cast<size_t>(size), type);
  CheckBuffer("reducescatter", output, count, 1, type);
}

}  // namespace

void Communicator::AllReduce(void* data, size_t count, DataType type, ReduceOp op, Algorithm algo) {
  CheckAllReduce(data, count, type, algo);
  RunOrdered([&] { DoAllReduce(data, count, type, op, algo); });
}

void Communicator::Broadcast(void* data, size_t count, DataType type, int root, Algorithm algo) {
  CheckBroadcast(data, count, type, root, algo, size());
  RunOrdered([&] { DoBroadcast(data, count, type, root, algo); });
}

void Communicator::AllGather(const void* input, void* output, size_t count, DataType type) {
  CheckAllGather(input, output, count, type, size());
  RunOrdered([&] { DoAllGather(input, output, count, type); });
}

void Communicator::ReduceScatter(const void* input, void* output, size_t count, DataType type,
                                 ReduceOp op) {
  CheckReduceScatter(input, output, count, type, size());
  RunOrdered([&] { DoReduceScatter(input, output, count, type, op); });
}

void Communicator::Barrier() {
  RunOrdered([&] { DoBarrier(); });
}

std::shared_ptr<Work> Communicator::AllReduceAsync(void* data, size_t count, DataType type,
                                                   ReduceOp op, Algorithm algo) {
  CheckAllReduce(data, count, type, algo);
  return Enqueue([=, this] { DoAllReduce(data, count, type, op, algo); });
}

std::shared_ptr<Work> Communicator::BroadcastAsync(void* data, size_t count, DataType type,
                                                   int root, Algorithm algo) {
  CheckBroadcast(data, count, type, root, algo, size());
  return Enqueue([=, this] { DoBroadcast(data, count, type, root, algo); });
}

std::shared_ptr<Work> Communicator::AllGatherAsync(const void* input, void* output, size_t count,
                                                   DataType type) {
  CheckAllGather(input, output, count, type, size());
  return Enqueue([=, this] { DoAllGather(input, output, count, type); });
}

std::shared_ptr<Work> Communicator::ReduceScatterAsync(const void* input, void* output,
                                                       size_t count, DataType type, ReduceOp op) {
  CheckReduceScatter(input, output, count, type, size());
  return Enqueue([=, this] { DoReduceScatter(input, output, count, type, op); });
}

std::shared_ptr<Work> Communicator::BarrierAsync() {
  return Enqueue([this] { DoBarrier(); });
}

namespace {

void CheckCompressed(float* data, size_t count, ReduceOp op) {
  CheckBuffer("allreduce", data, count, 1, DataType::kF32);
  if (op == ReduceOp::kMax) {
    throw Error(ErrorKind::kInvalidArgument,
                "allreduce: a compressed all-reduce sums or averages (op 'max' is not encoded)", -1,
                "allreduce");
  }
}

}  // namespace

// The parts every backend shares: nothing to encode (f32), nothing to send (one rank or no
// elements: still numbered on every rank, like AllReduce), then the backend's ring.
void Communicator::RunCompressed(float* data, size_t count, ReduceOp op,
                                 const Compression& compression) {
  if (compression.codec == CodecKind::kF32) {
    DoAllReduce(data, count, DataType::kF32, op, Algorithm::kAuto);
    return;
  }
  if (size() == 1 || count == 0) {
    // One rank: the average is the data itself, and nothing is encoded, so nothing is lost.
    if (compression.residual != nullptr) {
      for (size_t i = 0; i < count; ++i) {
        data[i] += compression.residual[i];
        compression.residual[i] = 0;
      }
    }
    if (size() > 1) DoAllReduce(data, 0, DataType::kF32, op, Algorithm::kAuto);
    return;
  }
  DoAllReduceCompressed(data, count, op, compression);
}

void Communicator::AllReduceCompressed(float* data, size_t count, ReduceOp op,
                                       const Compression& compression) {
  CheckCompressed(data, count, op);
  RunOrdered([&] { RunCompressed(data, count, op, compression); });
}

std::shared_ptr<Work> Communicator::AllReduceCompressedAsync(float* data, size_t count, ReduceOp op,
                                                             const Compression& compression) {
  CheckCompressed(data, count, op);
  return Enqueue([=, this] { RunCompressed(data, count, op, compression); });
}

std::unique_ptr<Communicator> Communicator::Split(int color, int key) {
  if (color < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                StrCat("split: color ", color,
                       " is negative (every rank must pass a color >= 0; ranks that want no "
                       "communicator can ignore the one they get)"),
                -1, "split");
  }
  std::unique_ptr<Communicator> child;
  RunOrdered([&] { child = DoSplit(color, key); });
  return child;
}

bool HasMpiBackend() {
#ifdef CORTADO_DIST_HAS_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> CreateCommunicator(const CommConfig& config) {
  if (config.options.backend == Backend::kMpi) {
#ifdef CORTADO_DIST_HAS_MPI
    return internal::CreateMpiCommunicator(config.options);
#else
    Fail(ErrorKind::kConfig,
         "CORTADO_BACKEND=mpi, but this build has no MPI backend (MPI was not found when it "
         "was configured)");
#endif
  }
  return internal::CreateTransportCommunicator(config);
}

CommConfig CommConfigFor(const LaunchInfo& info, const CommOptions& options) {
  CommConfig config;
  config.rank = info.rank;
  config.world_size = info.world_size;
  config.master_addr = info.master_addr;
  config.master_port = info.master_port;
  config.store_fd = info.store_fd;
  config.job_token = info.job_token;
  config.options = options;
  return config;
}

std::unique_ptr<Communicator> CreateCommunicatorFromEnv(uint64_t fingerprint) {
  const CommOptions options = CommOptions::FromEnv();
  // MPI knows rank and size itself.
  CommConfig config = options.backend == Backend::kMpi
                          ? CommConfigFor(LaunchInfo{}, options)
                          : CommConfigFor(DiscoverLaunchInfo(), options);
  config.fingerprint = fingerprint;
  return CreateCommunicator(config);
}

}  // namespace cortado::dist
