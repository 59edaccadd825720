#include "data/loader.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "engine/base/error.h"

namespace cortado {
namespace {

int64_t ThreadCpuNs() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

}  // namespace

BatchLoader::BatchLoader(int threads, int prefetch, int64_t batch_size, Shape sample_shape,
                         PlanFn plan, ProduceFn produce, Extras extras)
    : threads_(threads),
      batch_size_(batch_size),
      sample_shape_(std::move(sample_shape)),
      sample_numel_(ShapeNumel(sample_shape_)),
      row_width_(extras.row_width),
      info_width_(extras.info_width),
      plan_(std::move(plan)),
      produce_(std::move(produce)) {
  CORTADO_CHECK(threads >= 1, "data loader needs at least one thread, got ", threads);
  CORTADO_CHECK(prefetch >= 1, "data.prefetch must be at least 1, got ", prefetch);
  CORTADO_CHECK(batch_size >= 1, "batch size must be positive, got ", batch_size);
  CORTADO_CHECK(row_width_ >= 0 && info_width_ >= 0, "row and info widths must be >= 0, got ",
                row_width_, " and ", info_width_);
  slots_.resize(static_cast<size_t>(prefetch) + 1);
}

BatchLoader::~BatchLoader() { StopWorkers(); }

void BatchLoader::StopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void BatchLoader::Start() {
  StopWorkers();
  planned_ = released_ = consumed_ = 0;
  holding_ = ended_ = stop_ = false;
  error_ = nullptr;
  error_batch_ = std::numeric_limits<int64_t>::max();
  for (Slot& slot : slots_) {
    slot.batch = -1;
    slot.samples.clear();
    slot.next_task = slot.done = 0;
  }
  for (int w = 0; w < threads_; ++w) workers_.emplace_back([this, w] { WorkerLoop(w); });
}

bool BatchLoader::PlanNextLocked() {
  const int64_t ring = static_cast<int64_t>(slots_.size());
  if (ended_ || planned_ >= released_ + ring || planned_ >= error_batch_) return false;
  Slot& slot = slots_[planned_ % ring];
  slot.samples.clear();
  plan_(planned_, &slot.samples);
  const int64_t count = static_cast<int64_t>(slot.samples.size());
  CORTADO_ASSERT(count <= batch_size_);
  if (count == 0) {
    ended_ = true;
    ready_cv_.notify_all();
    return false;
  }
  slot.batch = planned_;
  slot.next_task = slot.done = slot.skipped = 0;
  slot.left_out.assign(static_cast<size_t>(count), false);
  // Buffers are allocated for a full batch on first use (an evaluation source that never
  // runs holds no memory) and keep their storage from then on; a short last batch is the
  // same storage with fewer rows.
  Shape shape = {batch_size_};
  shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
  if (!slot.images.defined()) {
    slot.images = Tensor(shape, DType::kF32);
    slot.labels = Tensor({batch_size_}, DType::kI32);
    // Room for a few objects per image to start with; more grows it (rarely, then it stays).
    if (row_width_ > 0) slot.boxes = Tensor({1, 1, 8 * batch_size_, row_width_ + 1}, DType::kF32);
    if (info_width_ > 0) slot.info = Tensor({batch_size_, info_width_}, DType::kI32);
  }
  if (row_width_ > 0 && static_cast<int64_t>(slot.rows.size()) < count) {
    slot.rows.resize(static_cast<size_t>(count));
  }
  shape[0] = count;
  slot.images.Resize(shape);
  slot.labels.Resize({count});
  if (info_width_ > 0) slot.info.Resize({count, info_width_});
  ++planned_;
  work_cv_.notify_all();  // other idle workers can help with this batch
  return true;
}

void BatchLoader::RecordErrorLocked(int64_t batch) {
  // The earliest failing batch wins; batches before it are still completed and delivered.
  if (batch < error_batch_) {
    error_batch_ = batch;
    error_ = std::current_exception();
  }
  ready_cv_.notify_all();
}

void BatchLoader::WorkerLoop(int worker) {
  const int64_t ring = static_cast<int64_t>(slots_.size());
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // The oldest planned batch that still has samples nobody has taken.
    Slot* slot = nullptr;
    for (int64_t b = released_; b < std::min(planned_, error_batch_); ++b) {
      Slot& s = slots_[b % ring];
      if (s.next_task < static_cast<int64_t>(s.samples.size())) {
        slot = &s;
        break;
      }
    }
    if (slot == nullptr) {
      bool planned = false;
      try {
        planned = PlanNextLocked();
      } catch (...) {
        RecordErrorLocked(planned_);
      }
      if (!planned) work_cv_.wait(lock);
      continue;
    }
    const int64_t pos = slot->next_task++;
    const int64_t batch = slot->batch;
    const int64_t sample = slot->samples[pos];
    float* image = slot->images.data<float>() + pos * sample_numel_;
    // This position's places (its rows too) belong to this worker until it reports it done.
    SampleOut out;
    out.image = image;
    out.label = slot->labels.data<int32_t>() + pos;
    if (row_width_ > 0) out.rows = &slot->rows[static_cast<size_t>(pos)];
    if (info_width_ > 0) out.info = slot->info.data<int32_t>() + pos * info_width_;
    lock.unlock();
    Produced produced;
    const int64_t cpu0 = ThreadCpuNs();
    try {
      if (out.rows != nullptr) out.rows->clear();
      produced = produce_(worker, batch, pos, sample, out);
      CORTADO_CHECK(out.rows == nullptr || out.rows->size() % static_cast<size_t>(row_width_) == 0,
                    "data loader: sample ", sample, " produced ", out.rows->size(),
                    " floats of rows, not a multiple of ", row_width_);
    } catch (...) {
      lock.lock();
      RecordErrorLocked(batch);  // this batch never completes
      continue;
    }
    cpu_ns_ += ThreadCpuNs() - cpu0;
    lock.lock();
    slot->skipped += produced.skipped;
    slot->left_out[static_cast<size_t>(pos)] = produced.left_out;
    if (++slot->done == static_cast<int64_t>(slot->samples.size())) ready_cv_.notify_all();
  }
}

int64_t BatchLoader::CompactLocked(Slot& slot) {
  const int64_t count = static_cast<int64_t>(slot.samples.size());
  if (std::find(slot.left_out.begin(), slot.left_out.end(), true) == slot.left_out.end()) {
    return count;
  }
  float* images = slot.images.data<float>();
  int32_t* labels = slot.labels.data<int32_t>();
  int32_t* info = info_width_ > 0 ? slot.info.data<int32_t>() : nullptr;
  int64_t kept = 0;
  for (int64_t from = 0; from < count; ++from) {
    if (slot.left_out[static_cast<size_t>(from)]) continue;
    if (kept != from) {
      std::copy(images + from * sample_numel_, images + (from + 1) * sample_numel_,
                images + kept * sample_numel_);
      labels[kept] = labels[from];
      if (info != nullptr) {
        std::copy(info + from * info_width_, info + (from + 1) * info_width_,
                  info + kept * info_width_);
      }
    }
    ++kept;
  }
  Shape shape = slot.images.shape();
  shape[0] = kept;
  slot.images.Resize(shape);
  slot.labels.Resize({kept});
  if (info != nullptr) slot.info.Resize({kept, info_width_});
  return kept;
}

void BatchLoader::GatherRowsLocked(Slot& slot) {
  const size_t count = slot.samples.size();
  const size_t width = static_cast<size_t>(row_width_);
  int64_t rows = 0;
  for (size_t p = 0; p < count; ++p) {
    if (!slot.left_out[p]) rows += static_cast<int64_t>(slot.rows[p].size() / width);
  }
  slot.boxes.Resize({1, 1, rows, row_width_ + 1});
  float* out = slot.boxes.data<float>();
  int64_t item = 0;  // the position after compaction
  for (size_t p = 0; p < count; ++p) {
    if (slot.left_out[p]) continue;
    const std::vector<float>& r = slot.rows[p];
    for (size_t at = 0; at < r.size(); at += width) {
      *out++ = static_cast<float>(item);
      out = std::copy(r.begin() + static_cast<std::ptrdiff_t>(at),
                      r.begin() + static_cast<std::ptrdiff_t>(at + width), out);
    }
    ++item;
  }
}

bool BatchLoader::Next(Batch& out, double* wait_seconds, int64_t* skipped) {
  const int64_t ring = static_cast<int64_t>(slots_.size());
  std::unique_lock<std::mutex> lock(mu_);
  CORTADO_CHECK(!workers_.empty(), "BatchLoader::Next before Start");
  if (holding_) {
    // The caller is done with the batch it holds: its slot goes back to the ring.
    slots_[(consumed_ - 1) % ring].batch = -1;
    released_ = consumed_;
    holding_ = false;
    work_cv_.notify_all();
  }
  auto complete = [&] {
    if (consumed_ >= planned_) return false;
    const Slot& s = slots_[consumed_ % ring];
    return s.done == static_cast<int64_t>(s.samples.size());
  };
  // Batches before a failed one are delivered; the error surfaces at the failed batch.
  auto failed = [&] { return error_ && consumed_ >= error_batch_; };
  auto ready = [&] { return complete() || failed() || (ended_ && consumed_ == planned_); };
  if (!ready()) {
    const auto t0 = std::chrono::steady_clock::now();
    ready_cv_.wait(lock, ready);
    if (wait_seconds != nullptr) {
      *wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  if (!complete()) {
    if (failed()) std::rethrow_exception(error_);
    return false;  // ended
  }
  Slot& slot = slots_[consumed_ % ring];
  if (row_width_ > 0) GatherRowsLocked(slot);  // reads left_out, before compaction
  out.size = CompactLocked(slot);
  out.images = slot.images;
  out.labels = slot.labels;
  out.boxes = row_width_ > 0 ? slot.boxes : Tensor();
  out.info = info_width_ > 0 ? slot.info : Tensor();
  if (skipped != nullptr) *skipped += slot.skipped;
  ++consumed_;
  holding_ = true;
  return true;
}

}  // namespace cortado
