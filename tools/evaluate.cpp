#include "tools/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/base/error.h"
#include "engine/base/log.h"
#include "tools/metrics.h"

namespace cortado {
namespace {

using Clock = std::chrono::steady_clock;

double BlobValue(Net& net, const std::string& name) {
  if (!net.has_blob(name)) return NAN;
  const Tensor& t = net.blob(name)->data;
  // On a device: one explicit copy of the scalar.
  return ElementAsDouble(t.device() == Device::CPU() ? t : t.View({1}).To(Device::CPU()), 0);
}

// Where the pass stands, for the progress line: rounds (batches per rank, in lock step) and the
// images of every rank.
class EvalProgress {
 public:
  EvalProgress(double every_seconds, int64_t total_batches, int64_t total_images)
      : every_(every_seconds), total_batches_(total_batches), total_images_(total_images) {}

  void Add(double images) {
    ++batches_;
    images_ += images;
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    if (every_ <= 0 || seconds < next_) return;
    next_ = seconds + every_;
    const double rate = images_ / std::max(seconds, 1e-9);
    const double eta = rate > 0 ? (static_cast<double>(total_images_) - images_) / rate : -1;
    LogInfo("eval  batch ", batches_, "/", total_batches_, "  (", static_cast<int64_t>(images_),
            "/", total_images_, " images)  ", Fixed(rate, rate < 100 ? 1 : 0), " img/s  ETA ",
            FormatDuration(eta));
  }
  int64_t batches() const { return batches_; }

 private:
  double every_;
  int64_t total_batches_, total_images_;
  int64_t batches_ = 0;
  double images_ = 0;
  double next_ = every_;
  Clock::time_point start_ = Clock::now();
};

}  // namespace

void FeedBatch(Net& net, const Batch& batch) {
  CORTADO_CHECK(batch.images.dtype() == DType::kF32 && batch.labels.dtype() == DType::kI32,
                "data source produced ", batch.images.ToString(), " images and ",
                batch.labels.ToString(), " labels (want f32 and i32)");
  Tensor& data = net.input("data");
  CORTADO_CHECK(
      batch.images.ndim() == 4 && data.ndim() == 4 && batch.images.dim(1) == data.dim(1) &&
          batch.images.dim(2) == data.dim(2) && batch.images.dim(3) == data.dim(3),
      "data source produced images ", batch.images.ToString(), " but the net expects [N, ",
      data.dim(1), ", ", data.dim(2), ", ", data.dim(3), "]");
  const bool same_format = batch.images.format() == data.format() || batch.images.IsLayoutTrivial();
  if (net.device() != Device::CPU()) {
    // Onto the device by explicit copies, after any reorder or conversion on the host.
    Tensor images = batch.images;
    if (!same_format) images = images.Reordered(data.format());
    if (images.dtype() != data.dtype()) {
      Tensor converted(images.shape(), data.dtype());
      converted.set_format(images.format());
      converted.ConvertFrom(images);
      images = converted;
    }
    data.Resize(images.shape(), data.dtype());
    data.set_format(images.ndim() == 4 ? net.layout() : MemoryFormat::kNCHW);
    data.CopyFrom(images.To(net.device()));
    Tensor& label = net.input("label");
    label.Resize(batch.labels.shape(), DType::kI32);
    label.CopyFrom(batch.labels.To(net.device()));
    return;
  }
  if (data.dtype() == DType::kF32 && same_format) {
    data = batch.images;
    data.set_format(data.ndim() == 4 ? net.layout() : MemoryFormat::kNCHW);
  } else if (data.dtype() == DType::kF32) {
    // A source that wrote another memory format than the net's (the loader writes the net's):
    // reordered into the net's own input tensor.
    data.Resize(batch.images.shape(), data.dtype());
    data.ReorderFrom(batch.images);
  } else {
    // An f64 net (precision.compute: fp64) gets a converted copy in its own input tensor.
    Tensor images = batch.images.Reordered(data.format());
    data.Resize(batch.images.shape(), data.dtype());
    data.ConvertFrom(images);
  }
  net.input("label") = batch.labels;
}

EvalResult Evaluate(Net& net, BatchSource& source, dist::Communicator* comm,
                    const EvalControl& control) {
  const bool ranks = comm != nullptr && comm->size() > 1;
  const bool root = comm == nullptr || comm->rank() == 0;
  // The pass's size in all: the longest shard's batches, every shard's images.
  double size[2] = {static_cast<double>(source.batches_per_epoch()),
                    static_cast<double>(source.samples_per_epoch())};
  if (ranks) {
    comm->AllReduce(&size[0], 1, dist::DataType::kF64, dist::ReduceOp::kMax);
    comm->AllReduce(&size[1], 1, dist::DataType::kF64, dist::ReduceOp::kSum);
  }
  EvalProgress progress(root ? control.progress_seconds : 0, static_cast<int64_t>(size[0]),
                        static_cast<int64_t>(size[1]));
  Phase previous = net.phase();
  net.set_phase(Phase::kTest);
  // Sums: correct top-1 and top-5 images (whole numbers: the accuracy layers give fractions of
  // the batch), loss times images, images, records skipped.
  double sums[5] = {0, 0, 0, 0, 0};
  Batch batch;
  const int64_t skipped_before = source.stats().skipped_records;
  source.Start(0, 0);
  bool more = true, interrupted = false;
  for (;;) {
    if (more) more = source.Next(batch);
    const double n = more ? static_cast<double>(batch.size) : 0.0;
    // The round's vote: stop, a batch still to evaluate, its images (max, max, sum).
    double vote[3] = {control.stop != nullptr && control.stop->load() ? 1.0 : 0.0, more ? 1.0 : 0.0,
                      n};
    if (ranks) {
      comm->AllReduce(vote, 2, dist::DataType::kF64, dist::ReduceOp::kMax);
      comm->AllReduce(&vote[2], 1, dist::DataType::kF64, dist::ReduceOp::kSum);
    }
    if (vote[0] != 0) interrupted = true;
    if (interrupted || vote[1] == 0) break;
    if (n > 0) {  // n == 0: every record of the batch was unreadable, or this shard is done
      FeedBatch(net, batch);
      const double loss = net.Forward();
      sums[0] += std::round(BlobValue(net, "top1") * n);
      sums[1] += std::round(BlobValue(net, "top5") * n);
      sums[2] += loss * n;
      sums[3] += n;
    }
    progress.Add(vote[2]);
  }
  sums[4] = static_cast<double>(source.stats().skipped_records - skipped_before);
  net.set_phase(previous);
  if (ranks) comm->AllReduce(sums, 5, dist::DataType::kF64, dist::ReduceOp::kSum);
  EvalResult r;
  r.images = static_cast<int64_t>(sums[3]);
  r.skipped = static_cast<int64_t>(sums[4]);
  r.interrupted = interrupted;
  r.batches = progress.batches();
  r.total_batches = static_cast<int64_t>(size[0]);
  if (r.images > 0) {
    r.top1 = sums[0] / sums[3];
    r.top5 = sums[1] / sums[3];
    r.loss = sums[2] / sums[3];
  }
  return r;
}

}  // namespace cortado
