// BatchLoader: decode threads filling a ring of batch buffers ahead of the training thread.
//
// Batches are numbered 0, 1, 2, ... from the last Start(). A plan function (called under the
// loader's lock, in batch order) says which samples batch n holds; a produce function (called
// on the worker threads, any order) decodes one sample into its place in the batch buffer.
// All workers help with the oldest unfinished batch first, so a batch is ready as soon as
// possible and batches complete in order.
//
// Buffers: prefetch + 1 slots, each with its own image and label tensors allocated once. Next()
// hands the caller the slot's tensors (shared storage, no copy); they stay valid until the
// next call to Next() or Start(), which returns the slot to the ring. So up to `prefetch`
// batches are decoded while the caller works on one.
//
// Extras (detection): with row_width > 0, producing a sample also yields any number of rows of
// row_width floats (an image's objects), and Next() delivers them as Batch::boxes, a
// (1, 1, G, row_width + 1) tensor of the whole batch's rows in position order, each prefixed by
// its sample's position in the delivered batch (Caffe SSD's item_id), G >= 0. With
// info_width > 0, each sample also fills info_width int32s, delivered as Batch::info
// [N, info_width] beside the labels.
//
// Threads: Next() and Start() are called from one consumer thread. When a plan or produce
// function throws, the batches before the failed one are still completed and delivered, and
// Next() rethrows the exception when it reaches the failed batch; Start() clears it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "data/batch_source.h"

namespace cortado {

// What a sample yields besides its image and label (BatchLoader::Extras; see above).
struct LoaderExtras {
  int row_width = 0;
  int info_width = 0;
};

class BatchLoader {
 public:
  // Fills *samples with the sample ids of batch `batch` (at most batch_size of them); an empty
  // list ends the stream. Called under the loader's lock: keep it quick.
  using PlanFn = std::function<void(int64_t batch, std::vector<int64_t>* samples)>;
  // What producing one sample met, reported with its batch (so prefetching does not count it
  // early).
  struct Produced {
    int64_t skipped = 0;    // corrupt records passed over
    bool left_out = false;  // no sample here: the batch comes out without this position
  };
  // Where one sample goes: its image (C*H*W floats) and *label; with row_width > 0 its *rows
  // (empty on entry; a multiple of row_width floats on return), with info_width > 0 its info
  // (info_width int32s). Null where the loader has none.
  struct SampleOut {
    float* image = nullptr;
    int32_t* label = nullptr;
    std::vector<float>* rows = nullptr;
    int32_t* info = nullptr;
  };
  // Decodes sample `sample` (position `pos` of batch `batch`) into `out`, on worker thread
  // `worker` in [0, threads).
  using ProduceFn = std::function<Produced(int worker, int64_t batch, int64_t pos, int64_t sample,
                                           const SampleOut& out)>;
  using Extras = LoaderExtras;

  BatchLoader(int threads, int prefetch, int64_t batch_size, Shape sample_shape, PlanFn plan,
              ProduceFn produce, Extras extras = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  int threads() const { return threads_; }
  // CPU time the workers spent producing samples (decode, transform), summed over them.
  double cpu_seconds() const { return static_cast<double>(cpu_ns_.load()) * 1e-9; }

  // Restarts at batch 0 of a new plan (cancels and discards batches decoded ahead).
  void Start();
  // Stops the workers (until the next Start), so that the state the plan and produce functions
  // read can change without them running.
  void Stop() { StopWorkers(); }
  // The next batch; false at the end of the stream. Positions left out are removed (the
  // samples after them move up, so out.size may be below the plan's count, even 0). Adds the
  // time spent blocked to *wait_seconds and the corrupt records skipped for this batch to
  // *skipped (either may be null).
  bool Next(Batch& out, double* wait_seconds, int64_t* skipped = nullptr);

 private:
  struct Slot {
    Tensor images;
    Tensor labels;
    Tensor boxes;                          // rows of the delivered batch (row_width > 0)
    Tensor info;                           // [N, info_width] (info_width > 0)
    std::vector<std::vector<float>> rows;  // per position, as produced
    std::vector<int64_t> samples;
    int64_t batch = -1;          // batch number planned into this slot, -1: free
    int64_t next_task = 0;       // next position to hand to a worker
    int64_t done = 0;            // positions finished
    int64_t skipped = 0;         // corrupt records skipped while filling it
    std::vector<bool> left_out;  // per position
  };
  // Under mu_: moves the samples of a complete slot that were not left out to its front and
  // returns how many there are.
  int64_t CompactLocked(Slot& slot);
  // Under mu_: gathers the rows of a complete slot's positions that were not left out into
  // slot.boxes, each prefixed by its position after compaction.
  void GatherRowsLocked(Slot& slot);

  void StopWorkers();
  void WorkerLoop(int worker);
  // Under mu_: plans the next batch into its slot if the ring has room. False if not.
  bool PlanNextLocked();
  // Under mu_, in a catch block: remembers the exception as the failure of `batch`.
  void RecordErrorLocked(int64_t batch);

  const int threads_;
  const int64_t batch_size_;
  const Shape sample_shape_;
  const int64_t sample_numel_;
  const int row_width_;
  const int info_width_;
  PlanFn plan_;
  ProduceFn produce_;

  std::mutex mu_;
  std::condition_variable work_cv_;   // workers: a slot was planned or freed, or stop
  std::condition_variable ready_cv_;  // consumer: a slot completed, or an error
  std::vector<Slot> slots_;
  int64_t planned_ = 0;   // batches [0, planned_) have been planned
  int64_t released_ = 0;  // batches [0, released_) have been handed out and given back
  int64_t consumed_ = 0;  // batches [0, consumed_) have been handed out
  bool holding_ = false;  // the consumer holds batch consumed_ - 1
  bool ended_ = false;    // a plan came back empty at batch planned_
  bool stop_ = false;
  std::exception_ptr error_;  // the failure of batch error_batch_
  int64_t error_batch_ = std::numeric_limits<int64_t>::max();
  std::vector<std::thread> workers_;
  std::atomic<int64_t> cpu_ns_{0};
};

}  // namespace cortado
