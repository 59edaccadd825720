#include "engine/base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/base/env.h"
#include "engine/base/error.h"

extern "C" void openblas_set_num_threads(int);

namespace cortado {
namespace {

thread_local bool t_in_worker = false;

// How many pause-loops a waiting thread spins before it sleeps: about 30 microseconds, or
// none with CORTADO_SPIN=0 (for machines whose cores other busy processes share, where
// spinning takes time from them).
int SpinCount() {
  static const int count = [] {
    return EnvChoice("CORTADO_SPIN", "1", {"0", "1"}) == "0" ? 0 : 4000;
  }();
  return count;
}

// The test hook of SetWorkerHookForTesting; nullptr in normal runs.
std::atomic<void (*)(int)> g_worker_hook{nullptr};

// A job is published as one 64-bit word, its number in the high bits and its task count in the
// low kTaskBits, so a worker reads both in a single load: it can never combine one job's number
// with another job's task count. (Reading them as two variables let a worker that sat out a
// small job and was preempted before reading the count take the next, larger job's count for
// the small job's, then run its task of the larger job twice, once per job number.)
constexpr int kTaskBits = 16;  // tasks <= NumThreads() <= 1024
constexpr uint64_t kTaskMask = (uint64_t{1} << kTaskBits) - 1;

// Each job runs task t on worker t-1 while the caller runs task 0. Both sides spin briefly
// before sleeping on a condition variable: a training step issues hundreds of short parallel
// regions and a futex wake-up costs tens of microseconds on a VM (ResNet-20 on 2 idle cores:
// 7% faster with the spin).
//
// Why fn_ may stay a plain pointer: a worker reads it only for a job that includes it, and such
// a job cannot finish, so Run cannot return and publish another fn_, before that worker has run
// its task and counted it off pending_. A worker that a job does not include reads nothing but
// the job word.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { Loop(i); });
  }
  ~Pool() {
    stop_.store(true);
    Publish(0);
    for (auto& w : workers_) w.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void Run(int tasks, const std::function<void(int)>& fn) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);  // one job at a time
    fn_ = &fn;
    error_ = nullptr;
    pending_.store(tasks - 1, std::memory_order_relaxed);
    Publish(tasks);      // release: publishes fn_, error_ and pending_ with the job word
    t_in_worker = true;  // nested ParallelFor calls from task 0 run inline
    RunTask(0);
    t_in_worker = false;
    auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
    if (!SpinUntil(done)) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, done);
    }
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Stores the next job word and wakes sleeping workers. Only Run (under run_mutex_) and the
  // destructor publish, so the job number needs no atomic increment.
  void Publish(int tasks) {
    CORTADO_ASSERT(tasks >= 0 && static_cast<uint64_t>(tasks) <= kTaskMask);
    ++jobs_;
    job_.store((jobs_ << kTaskBits) | static_cast<uint64_t>(tasks), std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(mutex_);  // pairs with a worker about to sleep
    }
    wake_.notify_all();
  }
  // Spins up to SpinCount() pauses; true as soon as done() holds.
  template <typename Done>
  static bool SpinUntil(Done done) {
    for (int i = SpinCount(); i > 0; --i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    return done();
  }
  void RunTask(int t) {
    try {
      (*fn_)(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void Loop(int index) {
    t_in_worker = true;
    uint64_t seen = 0;  // the last job word this worker took
    for (;;) {
      uint64_t job = seen;
      auto changed = [&] {
        job = job_.load(std::memory_order_acquire);
        return job != seen;
      };
      if (!SpinUntil(changed)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, changed);
      }
      // `job` is one snapshot: its task count belongs to its number. A newer job may already
      // be published (if this one does not include us); the next turn of the loop takes it.
      seen = job;
      if (stop_.load()) return;
      if (auto hook = g_worker_hook.load(std::memory_order_relaxed)) hook(index);
      if (index >= static_cast<int>(job & kTaskMask)) continue;
      RunTask(index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);  // the caller may be about to sleep
        done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int)>* fn_ = nullptr;
  std::atomic<int> pending_{0};
  uint64_t jobs_ = 0;             // jobs published, the caller's count
  std::atomic<uint64_t> job_{0};  // (job number << kTaskBits) | task count
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

std::mutex g_pool_mutex;
std::unique_ptr<Pool> g_pool;
std::atomic<int> g_threads{0};

Pool& GetPool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) {
    int n = g_threads.load() > 0 ? g_threads.load() : DefaultNumThreads();
    g_threads = n;
    openblas_set_num_threads(1);
    g_pool = std::make_unique<Pool>(n);
  }
  return *g_pool;
}

}  // namespace

void SetWorkerHookForTesting(void (*hook)(int)) { g_worker_hook.store(hook); }

int DefaultNumThreads() {
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(EnvInt("CORTADO_NUM_THREADS", cores, 1, 1024));
}

void SetNumThreads(int n) {
  CORTADO_CHECK(n >= 1, "thread count must be at least 1, got ", n);
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  g_threads = n;
  openblas_set_num_threads(1);
  if (g_pool && g_pool->size() != n) g_pool.reset();
}

int NumThreads() {
  int n = g_threads.load();
  return n > 0 ? n : GetPool().size();
}

void ParallelTasks(int tasks, const std::function<void(int)>& fn) {
  if (tasks <= 0) return;
  if (tasks == 1 || t_in_worker) {
    for (int t = 0; t < tasks; ++t) fn(t);
    return;
  }
  Pool& pool = GetPool();
  CORTADO_ASSERT(tasks <= pool.size());
  pool.Run(tasks, fn);
}

void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int threads = NumThreads();
  int64_t max_tasks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  int tasks = static_cast<int>(std::min<int64_t>(threads, max_tasks));
  if (tasks <= 1 || t_in_worker) {
    fn(0, n);
    return;
  }
  ParallelTasks(tasks, [&](int t) {
    int64_t begin = n * t / tasks;
    int64_t end = n * (t + 1) / tasks;
    if (begin < end) fn(begin, end);
  });
}

}  // namespace cortado
