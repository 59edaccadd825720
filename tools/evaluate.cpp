#include "tools/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include "engine/base/error.h"
#include "engine/base/log.h"
#include "tools/device_feed.h"
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

// A tensor's elements as f32 (the detections of an f64 net; the boxes are f32 already).
std::vector<float> AsFloats(const Tensor& device_or_host) {
  const Tensor t =
      device_or_host.device() == Device::CPU() ? device_or_host : device_or_host.To(Device::CPU());
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    out[static_cast<size_t>(i)] = static_cast<float>(ElementAsDouble(t, i));
  }
  return out;
}

// The detector's class count K (labels 1..K): DetectionOutput's class logits have K + 1
// columns. 0 when the net has no DetectionOutput layer.
int DetectorClasses(Net& net) {
  for (const auto& layer : net.layers()) {
    if (layer->type() != "DetectionOutput") continue;
    const Tensor& logits = net.blob(layer->spec().inputs.at(0))->data;
    return static_cast<int>(logits.dim(logits.ndim() - 1)) - 1;
  }
  return 0;
}

// One pass's detection state on this rank: the metrics' accumulator and, for a results file,
// the detections with their images, as rows of doubles that gather across ranks.
class DetectionPass {
 public:
  static constexpr size_t kRow = 10;  // image index, id, width, height, label, score, box (4)

  DetectionPass(int num_classes, bool keep_rows) : acc_(num_classes), keep_rows_(keep_rows) {}

  void Add(Net& net, const Batch& batch) {
    const int64_t n = batch.size;
    CORTADO_CHECK(batch.boxes.defined() && batch.info.defined(),
                  "the net is a detector (it has a DetectionOutput layer) but the data source "
                  "gives no boxes (set data.task: detection)");
    const Tensor& out = net.blob("detections")->data;
    const std::vector<float> rows = AsFloats(out);
    const std::vector<float> truth = AsFloats(batch.boxes);
    const int k = acc_.num_classes();
    const auto dets = detection::ParseDetections(rows.data(), out.numel() / 7, k, n);
    const auto boxes = detection::ParseGroundTruth(truth.data(), batch.boxes.numel() / 8, k, n);
    std::vector<detection::ImageInfo> images(static_cast<size_t>(n));
    const int32_t* info = batch.info.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      detection::ImageInfo& im = images[static_cast<size_t>(i)];
      im.index = info[i * 3];
      im.id = info[i * 3];
      im.width = info[i * 3 + 1];
      im.height = info[i * 3 + 2];
    }
    acc_.Add(dets, boxes, images);
    if (!keep_rows_) return;
    for (const detection::Detection& d : dets) {
      const detection::ImageInfo& im = images[static_cast<size_t>(d.item)];
      const double row[kRow] = {static_cast<double>(im.index),
                                static_cast<double>(im.id),
                                im.width,
                                im.height,
                                static_cast<double>(d.label),
                                d.score,
                                d.box.xmin,
                                d.box.ymin,
                                d.box.xmax,
                                d.box.ymax};
      rows_.insert(rows_.end(), row, row + kRow);
    }
  }

  // Every rank's accumulator merged in rank order (and the rows given to rank 0's results).
  detection::DetectionMetrics Finish(dist::Communicator* comm, detection::CocoResults* results) {
    detection::DetectionAccumulator all(acc_.num_classes());
    const bool ranks = comm != nullptr && comm->size() > 1;
    if (!ranks) {
      all.Merge(acc_);
    } else {
      for (const std::vector<double>& packed : GatherAll(*comm, acc_.Pack())) {
        all.Merge(detection::DetectionAccumulator::Unpack(packed));
      }
    }
    if (results != nullptr && keep_rows_) {
      std::vector<double> rows;
      if (!ranks) {
        rows = rows_;
      } else {
        for (const std::vector<double>& part : GatherAll(*comm, rows_)) {
          rows.insert(rows.end(), part.begin(), part.end());
        }
      }
      if (comm == nullptr || comm->rank() == 0) AddResults(rows, *results);
    }
    return all.Compute();
  }

 private:
  // Every rank's vector, in rank order, on every rank: the lengths first, then the vectors
  // padded to the longest.
  static std::vector<std::vector<double>> GatherAll(dist::Communicator& comm,
                                                    const std::vector<double>& mine) {
    const size_t w = static_cast<size_t>(comm.size());
    double length = static_cast<double>(mine.size());
    std::vector<double> lengths(w);
    comm.AllGather(&length, lengths.data(), 1, dist::DataType::kF64);
    size_t longest = 1;
    for (double l : lengths) longest = std::max(longest, static_cast<size_t>(l));
    std::vector<double> padded(longest, 0.0), all(longest * w);
    std::copy(mine.begin(), mine.end(), padded.begin());
    comm.AllGather(padded.data(), all.data(), longest, dist::DataType::kF64);
    std::vector<std::vector<double>> out(w);
    for (size_t r = 0; r < w; ++r) {
      const double* first = all.data() + r * longest;
      out[r].assign(first, first + static_cast<size_t>(lengths[r]));
    }
    return out;
  }

  // The rows by image (stable: an image's detections keep DetectionOutput's order), so the
  // file does not depend on how images were spread over ranks.
  static void AddResults(const std::vector<double>& rows, detection::CocoResults& results) {
    const size_t count = rows.size() / kRow;
    std::vector<size_t> order(count);
    for (size_t i = 0; i < count; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return rows[a * kRow] < rows[b * kRow]; });
    for (size_t i : order) {
      const double* r = rows.data() + i * kRow;
      detection::ImageInfo im;
      im.index = static_cast<int64_t>(r[0]);
      im.id = static_cast<int64_t>(r[1]);
      im.width = r[2];
      im.height = r[3];
      detection::Detection d;
      d.item = 0;
      d.label = static_cast<int>(r[4]);
      d.score = r[5];
      d.box = {r[6], r[7], r[8], r[9]};
      results.Add(std::span<const detection::Detection>(&d, 1),
                  std::span<const detection::ImageInfo>(&im, 1));
    }
  }

  detection::DetectionAccumulator acc_;
  bool keep_rows_ = false;
  std::vector<double> rows_;
};

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
  if (net.device() != Device::CPU()) return FeedStaged(net, StageBatch(net, batch));
  CheckBatchFitsNet(net, batch);
  Tensor& data = net.input("data");
  const bool same_format = batch.images.format() == data.format() || batch.images.IsLayoutTrivial();
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
  // A detector's label input is the batch's ground-truth boxes (f32, declared keep_dtype).
  const bool boxes = batch.boxes.defined() && net.input("label").dtype() != DType::kI32;
  net.input("label") = boxes ? batch.boxes : batch.labels;
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
  const int detector_classes = DetectorClasses(net);
  std::unique_ptr<DetectionPass> detections;
  // DetectionOutput sizes its rows on the host after Forward; a device's copy does not follow.
  CORTADO_CHECK(detector_classes == 0 || net.device() == Device::CPU(),
                "evaluating a detector runs on the CPU only for now (--device cpu), not on ",
                net.device().ToString());
  if (detector_classes > 0) {
    detections = std::make_unique<DetectionPass>(detector_classes, control.results != nullptr);
  }
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
      if (detections) {
        detections->Add(net, batch);
      } else {
        sums[0] += std::round(BlobValue(net, "top1") * n);
        sums[1] += std::round(BlobValue(net, "top5") * n);
      }
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
  if (detections && !interrupted) {
    r.detection = true;
    r.metrics = detections->Finish(comm, control.results);
    r.map50 = r.metrics.voc07_map;
    r.map = r.metrics.coco_map;
  }
  return r;
}

}  // namespace cortado
