#include "data/idx_source.h"

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "data/sharding.h"
#include "engine/base/error.h"
#include "engine/base/random.h"

namespace cortado {
namespace {

// Fashion-MNIST training-set statistics, in [0, 1] pixel units.
constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

std::vector<uint8_t> ReadGzFile(const std::string& path) {
  CORTADO_CHECK(std::filesystem::exists(path), "data file '", path, "' does not exist");
  gzFile f = gzopen(path.c_str(), "rb");
  CORTADO_CHECK(f != nullptr, "cannot open data file '", path, "'");
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      gzclose(f);
      Fail("cannot read '", path, "' (corrupt gzip stream)");
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  gzclose(f);
  return out;
}

uint32_t BigEndian32(const std::vector<uint8_t>& b, size_t off) {
  return (uint32_t{b[off]} << 24) | (uint32_t{b[off + 1]} << 16) | (uint32_t{b[off + 2]} << 8) |
         uint32_t{b[off + 3]};
}

// Shared by the train and eval sources: decoded pixels, normalization, and batch filling.
class IdxSourceBase : public BatchSource {
 public:
  IdxSourceBase(const std::string& path, const DataOptions& options, int64_t batch_size)
      : data_(ReadIdxDataset(path)), batch_size_(batch_size), flip_(options.flip) {
    CORTADO_CHECK(batch_size > 0, "data.batch_size must be positive, got ", batch_size);
    mean_ = options.mean.empty() ? kFashionMean : options.mean[0];
    double std = options.std.empty() ? kFashionStd : options.std[0];
    CORTADO_CHECK(options.mean.size() <= 1 && options.std.size() <= 1,
                  "data.mean and data.std take one value for 1-channel IDX images");
    CORTADO_CHECK(std > 0, "data.std must be positive, got ", std);
    inv_std_ = 1.0 / std;
    for (uint8_t l : data_.labels) num_classes_ = std::max<int64_t>(num_classes_, l + 1);
  }
  int64_t batch_size() const override { return batch_size_; }
  Shape sample_shape() const override { return {1, data_.height, data_.width}; }
  int64_t num_classes() const override { return num_classes_; }
  SourceStats stats() const override { return stats_; }

 protected:
  // Writes sample `index` into slot `slot` of the batch, mirrored when `flip`.
  void FillSample(Batch& out, int64_t slot, int64_t index, bool flip) {
    const int64_t h = data_.height, w = data_.width;
    const uint8_t* src = data_.pixels.data() + index * h * w;
    float* dst = out.images.data<float>() + slot * h * w;
    const float scale = static_cast<float>(inv_std_ / 255.0);
    const float shift = static_cast<float>(-mean_ * inv_std_);
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        int64_t sx = flip ? w - 1 - x : x;
        dst[y * w + x] = src[y * w + sx] * scale + shift;
      }
    }
    out.labels.data<int32_t>()[slot] = data_.labels[index];
  }
  void ShapeBatch(Batch& out, int64_t n) {
    out.images.Resize({n, 1, data_.height, data_.width}, DType::kF32);
    out.labels.Resize({n}, DType::kI32);
    out.size = n;
  }

  IdxDataset data_;
  int64_t batch_size_;
  bool flip_;
  double mean_ = 0, inv_std_ = 1;
  int64_t num_classes_ = 0;
  SourceStats stats_;
};

class IdxTrainSource final : public IdxSourceBase {
 public:
  IdxTrainSource(const DataOptions& options, ShardSpec shard, uint64_t seed)
      : IdxSourceBase(options.train, options, options.batch_size),
        sharder_(data_.count, options.batch_size, shard, options.shuffle, options.drop_last, seed),
        seed_(seed) {}

  int64_t samples_per_epoch() const override { return sharder_.samples_per_epoch(); }
  int64_t batches_per_epoch() const override { return sharder_.batches_per_epoch(); }

  void Start(int64_t epoch, int64_t batch) override {
    CORTADO_CHECK(batch >= 0 && batch < batches_per_epoch(), "data position ", batch,
                  " is outside the epoch (", batches_per_epoch(), " batches)");
    epoch_ = epoch;
    batch_ = batch;
    order_ = sharder_.RankOrder(epoch_);
  }

  bool Next(Batch& out) override {
    if (order_.empty()) Start(0, 0);
    if (batch_ == batches_per_epoch()) Start(epoch_ + 1, 0);
    ShapeBatch(out, batch_size_);
    for (int64_t i = 0; i < batch_size_; ++i) {
      int64_t position = batch_ * batch_size_ + i;
      int64_t index = order_[position];
      // Flip decided by (seed, epoch, position in the shared permutation): identical after a
      // resume and whatever the number of ranks.
      const uint64_t global = static_cast<uint64_t>(sharder_.GlobalPosition(position));
      bool flip = flip_ && KeyToUniform(HashCombine(HashCombine(seed_ ^ 0x464c4950ull, epoch_),
                                                    global)) < 0.5;
      FillSample(out, i, index, flip);
    }
    ++batch_;
    return true;
  }

 private:
  EpochSharder sharder_;
  uint64_t seed_;
  int64_t epoch_ = 0, batch_ = 0;
  std::vector<int64_t> order_;
};

class IdxEvalSource final : public IdxSourceBase {
 public:
  IdxEvalSource(const DataOptions& options, ShardSpec shard)
      : IdxSourceBase(options.val, options,
                      options.val_batch_size > 0 ? options.val_batch_size : options.batch_size) {
    // Rank r evaluates samples r, r+W, ...: disjoint, and together they cover the set once.
    for (int64_t i = shard.rank; i < data_.count; i += shard.world_size) indices_.push_back(i);
  }
  int64_t samples_per_epoch() const override { return static_cast<int64_t>(indices_.size()); }
  int64_t batches_per_epoch() const override {
    return (samples_per_epoch() + batch_size_ - 1) / batch_size_;
  }
  void Start(int64_t epoch, int64_t batch) override {
    CORTADO_CHECK(epoch == 0 && batch == 0, "an evaluation source only restarts from the top");
    next_ = 0;
  }
  bool Next(Batch& out) override {
    int64_t n = std::min<int64_t>(batch_size_, samples_per_epoch() - next_);
    if (n <= 0) return false;
    ShapeBatch(out, n);
    for (int64_t i = 0; i < n; ++i) FillSample(out, i, indices_[next_ + i], false);
    next_ += n;
    return true;
  }

 private:
  std::vector<int64_t> indices_;
  int64_t next_ = 0;
};

}  // namespace

std::string IdxLabelsPathFor(const std::string& images_path) {
  std::string path = images_path;
  size_t pos = path.rfind("images-idx3");
  CORTADO_CHECK(pos != std::string::npos, "IDX images file '", images_path,
                "' should be named like train-images-idx3-ubyte[.gz] (its labels file is found "
                "by replacing images-idx3 with labels-idx1)");
  path.replace(pos, 11, "labels-idx1");
  return path;
}

IdxDataset ParseIdxDataset(const std::vector<uint8_t>& img, const std::vector<uint8_t>& lab,
                           const std::string& images_path, const std::string& labels_path) {
  CORTADO_CHECK(img.size() >= 16 && BigEndian32(img, 0) == 0x803, "'", images_path,
                "' is not an IDX images file (magic 0x803 expected)");
  CORTADO_CHECK(lab.size() >= 8 && BigEndian32(lab, 0) == 0x801, "'", labels_path,
                "' is not an IDX labels file (magic 0x801 expected)");
  IdxDataset d;
  d.count = BigEndian32(img, 4);
  d.height = BigEndian32(img, 8);
  d.width = BigEndian32(img, 12);
  // Three 32-bit sizes multiply to up to 96 bits: checked, so that a header whose product
  // wraps (16 images of 2^30 x 2^30 are 2^64 pixels, 0 in 64 bits) cannot pass as a short file.
  int64_t pixels = 0;
  CORTADO_CHECK(!__builtin_mul_overflow(d.height, d.width, &pixels) &&
                    !__builtin_mul_overflow(pixels, d.count, &pixels) &&
                    !__builtin_add_overflow(pixels, int64_t{16}, &pixels),
                "'", images_path, "': its header says ", d.count, " images of ", d.height, "x",
                d.width, ", too large for any file");
  CORTADO_CHECK(static_cast<int64_t>(img.size()) == pixels, "'", images_path,
                "' is truncated: header says ", d.count, " images of ", d.height, "x", d.width);
  CORTADO_CHECK(BigEndian32(lab, 4) == d.count && static_cast<int64_t>(lab.size()) == 8 + d.count,
                "'", labels_path, "' does not hold one label per image of '", images_path, "'");
  d.pixels.assign(img.begin() + 16, img.end());
  d.labels.assign(lab.begin() + 8, lab.end());
  return d;
}

IdxDataset ReadIdxDataset(const std::string& images_path) {
  CORTADO_CHECK(!images_path.empty(), "no IDX images file given (data.train / data.val)");
  const std::string labels_path = IdxLabelsPathFor(images_path);
  return ParseIdxDataset(ReadGzFile(images_path), ReadGzFile(labels_path), images_path,
                         labels_path);
}

std::unique_ptr<BatchSource> MakeIdxTrainSource(const DataOptions& options, ShardSpec shard,
                                                uint64_t seed) {
  return std::make_unique<IdxTrainSource>(options, shard, seed);
}

std::unique_ptr<BatchSource> MakeIdxEvalSource(const DataOptions& options, ShardSpec shard) {
  return std::make_unique<IdxEvalSource>(options, shard);
}

}  // namespace cortado
