#include "data/lmdb_source.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "data/label_map.h"
#include "data/lmdb.h"
#include "data/loader.h"
#include "data/record_decoder.h"
#include "data/sharding.h"
#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/base/random.h"
#include "engine/base/thread_pool.h"

namespace cortado {
namespace {

// data.mean or data.std: empty keeps the default; one value is repeated to three channels.
void SetChannels(const std::vector<double>& v, const char* key, std::array<float, 3>* out) {
  if (v.empty()) return;
  CORTADO_CHECK(v.size() == 1 || v.size() == 3, "data.", key,
                " takes 1 or 3 values (RGB) for LMDB images, got ", v.size());
  for (int c = 0; c < 3; ++c) (*out)[c] = static_cast<float>(v[v.size() == 1 ? 0 : c]);
}

}  // namespace

TransformOptions TransformOptionsFrom(const DataOptions& options) {
  TransformOptions t;
  CORTADO_CHECK(options.crop > 0 && options.crop <= 16384, "data.crop must be in 1..16384, got ",
                options.crop);
  CORTADO_CHECK(options.val_resize >= options.crop, "data.val_resize (", options.val_resize,
                ") must be at least data.crop (", options.crop, ")");
  t.crop = static_cast<int>(options.crop);
  t.val_resize = static_cast<int>(options.val_resize);
  t.scale_min = options.scale_min;
  t.scale_max = options.scale_max;
  t.ratio_min = options.ratio_min;
  t.ratio_max = options.ratio_max;
  t.flip = options.flip;
  t.channels_last = options.channels_last;
  SetChannels(options.mean, "mean", &t.mean);
  SetChannels(options.std, "std", &t.std);
  for (float s : t.std) CORTADO_CHECK(s > 0, "data.std must be positive, got ", s);
  return t;
}

DetectionTransformOptions DetectionTransformOptionsFrom(const DataOptions& options) {
  DetectionTransformOptions t;
  CORTADO_CHECK(options.resize > 0 && options.resize <= 16384,
                "data.resize must be in 1..16384, got ", options.resize);
  CORTADO_CHECK(options.max_expand_ratio >= 1, "data.max_expand_ratio must be >= 1, got ",
                options.max_expand_ratio);
  t.size = static_cast<int>(options.resize);
  t.distort = options.distort;
  t.expand = options.expand;
  t.max_expand_ratio = options.max_expand_ratio;
  t.iou_crop = options.iou_crop;
  t.flip = options.flip;
  t.channels_last = options.channels_last;
  SetChannels(options.mean, "mean", &t.mean);
  SetChannels(options.std, "std", &t.std);
  for (float s : t.std) CORTADO_CHECK(s > 0, "data.std must be positive, got ", s);
  return t;
}

Shape LmdbSampleShape(const DataOptions& options) {
  const int64_t side = options.task == "detection" ? options.resize : options.crop;
  return {3, side, side};
}

int64_t DetectionNumClasses(const DataOptions& options, const std::string& db) {
  if (!options.label_map.empty())
    return static_cast<int64_t>(ReadLabelMap(options.label_map).size());
  const int64_t listed = ReadNumClasses(db);
  if (listed >= 0) return listed;
  const std::string map = (std::filesystem::path(db) / kLabelMapFile).string();
  return std::filesystem::exists(map) ? static_cast<int64_t>(ReadLabelMap(map).size()) : -1;
}

int64_t ReadNumClasses(const std::string& db) {
  std::ifstream in(db + "/classes.txt");
  if (!in) return -1;
  int64_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

void CheckLmdbComplete(const std::string& path, int64_t records) {
  namespace fs = std::filesystem;
  const std::optional<LmdbCompletion> done = ReadLmdbCompletion(path);
  const std::string root = done && !done->root.empty() ? done->root : "IMAGES";
  const std::string rebuild =
      StrCat("rebuild it with: cortado convert --root ", root, " --out ", path, " --overwrite");
  if (done) {
    CORTADO_CHECK(done->records == records, "LMDB ", path, " holds ", records, " records but its ",
                  kLmdbCompleteFile, " says ", done->records, " (changed since it was converted); ",
                  rebuild);
    return;
  }
  std::error_code ec;
  const bool from_cortado = fs::exists(fs::path(path) / "classes.txt", ec) ||
                            fs::exists(fs::path(path) / "skipped.txt", ec);
  CORTADO_CHECK(!from_cortado, "LMDB ", path, " is incomplete: it has no ", kLmdbCompleteFile,
                " (its cortado convert was interrupted, or predates completion records); ",
                rebuild);
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(path).second) {
    LogWarning("data: LMDB ", path, " has no ", kLmdbCompleteFile,
               " and no classes.txt: read as a database from another tool (Caffe's "
               "convert_imageset, Caffe SSD's convert_annoset), whose completeness cannot be "
               "checked");
  }
}

namespace {

// Batch::info of a detection sample: record index, width, height.
constexpr int kInfoWidth = 3;

int LoaderThreads(const DataOptions& options) {
  CORTADO_CHECK(options.threads >= 0, "data.threads must be >= 0, got ", options.threads);
  const int budget = NumThreads();
  if (options.threads == 0) return budget;
  if (options.threads > budget) {
    LogInfo("data.threads ", options.threads, " exceeds the thread budget (", budget, "); using ",
            budget);
    return budget;
  }
  return options.threads;
}

// Shared by the train and eval sources: the database, the per-thread decode state, the loader
// and corrupt-record handling.
class LmdbSourceBase : public BatchSource {
 public:
  LmdbSourceBase(const std::string& path, const DataOptions& options, int64_t batch_size,
                 bool train)
      : reader_(OpenReader(path, train)),
        batch_size_(batch_size),
        train_(train),
        detection_(IsDetection(options)),
        channels_last_(options.channels_last),
        sample_shape_(LmdbSampleShape(options)),
        num_classes_(detection_ ? DetectionNumClasses(options, path) : ReadNumClasses(path)) {
    CORTADO_CHECK(batch_size > 0, "data batch size must be positive, got ", batch_size);
    CheckLmdbComplete(path, reader_->size());
    CheckTask(path, options.task);
    CORTADO_CHECK(reader_->size() > 0, "LMDB ", path, " holds no records");
    const int threads = LoaderThreads(options);
    for (int i = 0; i < threads; ++i) {
      auto w = std::make_unique<Worker>(reader_->BeginRead());
      if (detection_) {
        w->detect = std::make_unique<DetectionDecoder>(DetectionTransformOptionsFrom(options));
      } else {
        w->classify = std::make_unique<RecordDecoder>(TransformOptionsFrom(options));
      }
      workers_.push_back(std::move(w));
    }
    loader_ = std::make_unique<BatchLoader>(
        threads, options.prefetch, batch_size, sample_shape(),
        [this](int64_t batch, std::vector<int64_t>* samples) { Plan(batch, samples); },
        [this](int worker, int64_t batch, int64_t, int64_t sample,
               const BatchLoader::SampleOut& out) { return Produce(worker, batch, sample, out); },
        detection_ ? BatchLoader::Extras{kBoxRowWidth, kInfoWidth} : BatchLoader::Extras{});
  }

  // Derived sources stop the loader in their destructors: its threads call their Plan.
  ~LmdbSourceBase() override { loader_.reset(); }

  int64_t batch_size() const override { return batch_size_; }
  Shape sample_shape() const override { return sample_shape_; }
  int64_t num_classes() const override { return num_classes_; }
  SourceStats stats() const override {
    SourceStats s;
    s.skipped_records = skipped_;
    s.wait_seconds = wait_seconds_;
    s.loader_threads = loader_->threads();
    s.loader_cpu_seconds = loader_->cpu_seconds();
    return s;
  }

 protected:
  static std::shared_ptr<const LmdbReader> OpenReader(const std::string& path, bool train) {
    CORTADO_CHECK(!path.empty(), "data.", train ? "train" : "val", ": no LMDB path given");
    return LmdbReader::Open(path, /*random_access=*/train);
  }

  static bool IsDetection(const DataOptions& options) {
    CORTADO_CHECK(options.task == "classification" || options.task == "detection",
                  "data.task must be classification or detection, got '", options.task, "'");
    return options.task == "detection";
  }

  // A database `cortado convert` wrote says what its records are: refuse the other task's
  // records before every one of them fails to decode.
  static void CheckTask(const std::string& path, const std::string& task) {
    const std::optional<LmdbCompletion> done = ReadLmdbCompletion(path);
    if (!done || done->task == task) return;
    Fail("LMDB ", path, " holds ", done->task,
         done->task == "detection" ? " records (Caffe SSD AnnotatedDatum)" : " records (Datum)",
         " but data.task is ", task, "; set data.task: ", done->task);
  }

  // The transformer wrote HWC samples: the batch is channels-last.
  void LabelFormat(Batch& out) const {
    if (channels_last_) out.images.set_format(MemoryFormat::kNHWC);
  }

  // Under the loader's lock: the record indices of batch `batch` since the last Start.
  virtual void Plan(int64_t batch, std::vector<int64_t>* samples) = 0;
  // The augmentation key of a sample of batch `batch` (training only).
  virtual uint64_t AugmentKey(int64_t batch, int64_t record) const = 0;

  std::shared_ptr<const LmdbReader> reader_;
  int64_t batch_size_;
  bool train_;
  bool detection_;      // AnnotatedDatum records, rows of objects with every sample
  bool channels_last_;  // samples are written HWC (the net's layout is nhwc)
  Shape sample_shape_;
  int64_t num_classes_;
  std::unique_ptr<BatchLoader> loader_;
  double wait_seconds_ = 0;
  int64_t skipped_ = 0;  // in the batches delivered so far
  bool started_ = false;

 private:
  struct Worker {
    explicit Worker(LmdbReader::ReadTxn t) : txn(std::move(t)) {}
    LmdbReader::ReadTxn txn;
    std::unique_ptr<RecordDecoder> classify;   // classification
    std::unique_ptr<DetectionDecoder> detect;  // detection
    std::string why;
  };

  // Decodes record `record` into image/label (and rows, for detection); false (with w.why) if
  // it is corrupt.
  bool DecodeRecord(Worker& w, int64_t record, uint64_t key, const BatchLoader::SampleOut& out) {
    if (detection_) return DecodeDetection(w, record, key, out);
    int32_t* label = out.label;
    if (!w.classify->Decode(w.txn.Get(record), train_, key, out.image, label)) {
      w.why = w.classify->why();
      return false;
    }
    // A label outside the class list is not a corrupt image but a wrong database or class
    // list: stop rather than train on it.
    CORTADO_CHECK(*label >= 0 && (num_classes_ < 0 || *label < num_classes_), "LMDB ",
                  reader_->path(), ": record '", reader_->key(record), "' has label ", *label,
                  num_classes_ < 0
                      ? std::string(" (negative)")
                      : StrCat(", outside the ", num_classes_, " classes of its classes.txt"));
    return true;
  }

  // Detection: *label is the number of objects (rows) the sample kept; info the record and its
  // image's size.
  bool DecodeDetection(Worker& w, int64_t record, uint64_t key, const BatchLoader::SampleOut& out) {
    std::vector<float>* rows = out.rows;
    if (!w.detect->Decode(w.txn.Get(record), train_, key, out.image, rows)) {
      w.why = w.detect->why();
      return false;
    }
    // Every object of the record, kept by the augmentation or not, so that a wrong label map
    // stops the run on the first record that shows it.
    for (const BoxAnnotation& b : w.detect->record_boxes()) {
      CORTADO_CHECK(b.label >= 1 && (num_classes_ < 0 || b.label < num_classes_), "LMDB ",
                    reader_->path(), ": record '", reader_->key(record),
                    "' has an object of label ", b.label,
                    num_classes_ < 0 ? std::string(" (labels are 1..K; 0 is the background)")
                                     : StrCat(", outside 1..", num_classes_ - 1,
                                              " (the classes of its label map; 0 is the "
                                              "background)"));
    }
    *out.label = static_cast<int32_t>(rows->size() / kBoxRowWidth);
    out.info[0] = static_cast<int32_t>(record);
    out.info[1] = w.detect->image_width();
    out.info[2] = w.detect->image_height();
    return true;
  }

  BatchLoader::Produced Produce(int worker, int64_t batch, int64_t sample,
                                const BatchLoader::SampleOut& out) {
    Worker& w = *workers_[worker];
    const uint64_t key = train_ ? AugmentKey(batch, sample) : 0;
    const int64_t n = reader_->size();
    int64_t record = sample;
    for (int64_t attempt = 0;; ++attempt) {
      w.why.clear();
      if (DecodeRecord(w, record, key, out)) return {attempt, false};
      ReportCorrupt(record, w.why);
      // Evaluation scores each readable record once: a substitute would be scored twice (on
      // several ranks often a record of another rank's shard).
      if (!train_) return {1, true};
      CORTADO_CHECK(attempt + 1 < std::min<int64_t>(n, 1000), "LMDB ", reader_->path(), ": ",
                    attempt + 1, " records in a row from '", reader_->key(sample),
                    "' do not decode; is this an image database?");
      record = (record + 1) % n;  // replaced by the next record
    }
  }

  // Once per record, and by name for the first kNamedCorrupt of them: a database with many
  // damaged records must not flood the log.
  void ReportCorrupt(int64_t record, const std::string& why) {
    constexpr size_t kNamedCorrupt = 5;
    std::lock_guard<std::mutex> lock(warned_mu_);
    if (!warned_.insert(record).second || warned_.size() > kNamedCorrupt + 1) return;
    if (warned_.size() == kNamedCorrupt + 1) {
      LogWarning("data: more corrupt records in ", reader_->path(), "; they are ",
                 train_ ? "replaced" : "left out", " and counted without naming them");
      return;
    }
    LogWarning("data: skipping corrupt record '", reader_->key(record), "' of ", reader_->path(),
               " (", why, "); ",
               train_ ? "using the next record instead" : "it is left out of the evaluation");
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex warned_mu_;
  std::set<int64_t> warned_;
};

class LmdbTrainSource final : public LmdbSourceBase {
 public:
  LmdbTrainSource(const DataOptions& options, ShardSpec shard, uint64_t seed)
      : LmdbSourceBase(options.train, options, options.batch_size, /*train=*/true),
        sharder_(reader_->size(), options.batch_size, shard, options.shuffle, options.drop_last,
                 seed),
        seed_(seed) {}
  ~LmdbTrainSource() override { loader_.reset(); }

  int64_t samples_per_epoch() const override { return sharder_.samples_per_epoch(); }
  int64_t batches_per_epoch() const override { return sharder_.batches_per_epoch(); }

  void Start(int64_t epoch, int64_t batch) override {
    CORTADO_CHECK(epoch >= 0 && batch >= 0 && batch < batches_per_epoch(), "data position ", batch,
                  " of epoch ", epoch, " is outside the epoch (", batches_per_epoch(), " batches)");
    // The workers read the position and the orders (AugmentKey, Plan): stop them first.
    loader_->Stop();
    start_epoch_ = epoch;
    start_batch_ = batch;
    orders_.clear();
    loader_->Start();
    started_ = true;
  }

  bool Next(Batch& out) override {
    if (!started_) Start(0, 0);
    const bool got = loader_->Next(out, &wait_seconds_, &skipped_);
    CORTADO_ASSERT(got);  // a training stream never ends
    LabelFormat(out);
    return true;
  }

 protected:
  // Batch `batch` after Start is batch (start + batch) of the stream of epochs.
  std::pair<int64_t, int64_t> EpochAndBatch(int64_t batch) const {
    const int64_t global = start_batch_ + batch;
    return {start_epoch_ + global / batches_per_epoch(), global % batches_per_epoch()};
  }

  void Plan(int64_t batch, std::vector<int64_t>* samples) override {
    const auto [epoch, in_epoch] = EpochAndBatch(batch);
    auto it = orders_.find(epoch);
    if (it == orders_.end()) {
      while (orders_.size() >= 2) orders_.erase(orders_.begin());  // keep this epoch and the last
      it = orders_.emplace(epoch, sharder_.RankOrder(epoch)).first;
    }
    const std::vector<int64_t>& order = it->second;
    samples->assign(order.begin() + in_epoch * batch_size_,
                    order.begin() + (in_epoch + 1) * batch_size_);
  }

  uint64_t AugmentKey(int64_t batch, int64_t record) const override {
    const int64_t epoch = EpochAndBatch(batch).first;
    return HashCombine(HashCombine(seed_ ^ 0x4155474dull, static_cast<uint64_t>(epoch)),
                       static_cast<uint64_t>(record));
  }

 private:
  EpochSharder sharder_;
  uint64_t seed_;
  int64_t start_epoch_ = 0, start_batch_ = 0;
  std::map<int64_t, std::vector<int64_t>> orders_;  // epoch -> this rank's order
};

class LmdbEvalSource final : public LmdbSourceBase {
 public:
  LmdbEvalSource(const DataOptions& options, ShardSpec shard)
      : LmdbSourceBase(options.val, options,
                       options.val_batch_size > 0 ? options.val_batch_size : options.batch_size,
                       /*train=*/false) {
    CORTADO_CHECK(shard.world_size >= 1 && shard.rank >= 0 && shard.rank < shard.world_size,
                  "bad shard: rank ", shard.rank, " of ", shard.world_size);
    // Rank r evaluates records r, r+W, ...: disjoint, and together they cover the set once.
    for (int64_t i = shard.rank; i < reader_->size(); i += shard.world_size) indices_.push_back(i);
  }
  ~LmdbEvalSource() override { loader_.reset(); }

  int64_t samples_per_epoch() const override { return static_cast<int64_t>(indices_.size()); }
  int64_t batches_per_epoch() const override {
    return (samples_per_epoch() + batch_size_ - 1) / batch_size_;
  }

  void Start(int64_t epoch, int64_t batch) override {
    CORTADO_CHECK(epoch == 0 && batch == 0, "an evaluation source only restarts from the top");
    loader_->Start();
    started_ = true;
  }

  bool Next(Batch& out) override {
    if (!started_) Start(0, 0);
    const bool got = loader_->Next(out, &wait_seconds_, &skipped_);
    if (got) LabelFormat(out);
    return got;
  }

 protected:
  void Plan(int64_t batch, std::vector<int64_t>* samples) override {
    const int64_t begin = batch * batch_size_;
    const int64_t end = std::min<int64_t>(begin + batch_size_, samples_per_epoch());
    if (begin < end) samples->assign(indices_.begin() + begin, indices_.begin() + end);
  }
  uint64_t AugmentKey(int64_t, int64_t) const override { return 0; }

 private:
  std::vector<int64_t> indices_;
};

}  // namespace

std::unique_ptr<BatchSource> MakeLmdbTrainSource(const DataOptions& options, ShardSpec shard,
                                                 uint64_t seed) {
  return std::make_unique<LmdbTrainSource>(options, shard, seed);
}

std::unique_ptr<BatchSource> MakeLmdbEvalSource(const DataOptions& options, ShardSpec shard) {
  return std::make_unique<LmdbEvalSource>(options, shard);
}

}  // namespace cortado
