#include "data/synthetic_source.h"

#include <algorithm>
#include <cstring>

#include "engine/base/error.h"
#include "engine/base/random.h"

namespace cortado {
namespace {

class SyntheticSource final : public BatchSource {
 public:
  SyntheticSource(const DataOptions& o, ShardSpec shard, uint64_t seed, bool training)
      : shape_(o.synthetic_shape),
        classes_(o.synthetic_classes),
        batch_size_(training || o.val_batch_size <= 0 ? o.batch_size : o.val_batch_size),
        training_(training),
        channels_last_(o.channels_last),
        seed_(seed) {
    CORTADO_CHECK(shape_.size() == 3 && shape_[0] > 0 && shape_[1] > 0 && shape_[2] > 0,
                  "data.synthetic_shape must be [C, H, W] with positive sizes");
    CORTADO_CHECK(classes_ >= 1, "data.synthetic_classes must be at least 1");
    CORTADO_CHECK(batch_size_ > 0, "data.batch_size must be positive, got ", batch_size_);
    const int64_t samples = training ? o.synthetic_samples : o.synthetic_val_samples;
    CORTADO_CHECK(samples >= 1, "data.synthetic.", training ? "samples" : "val_samples",
                  " must be at least 1");
    samples_ = std::max<int64_t>(1, samples / shard.world_size);
    if (training_) samples_ = std::max<int64_t>(batch_size_, samples_ / batch_size_ * batch_size_);
    // A small pool of distinct random images, cycled.
    const int64_t per = ShapeNumel(shape_);
    pool_.resize(kPool * per);
    Rng rng(HashCombine(seed, 0x53594e5448ull + static_cast<uint64_t>(shard.rank)));
    for (float& v : pool_) v = static_cast<float>(rng.Normal(0.0, 1.0));
    if (channels_last_) {
      // The same images, stored HWC: a channels-last net sees what an NCHW net sees.
      const std::vector<float> chw = pool_;
      ReorderHost(chw.data(), MemoryFormat::kNCHW, pool_.data(), MemoryFormat::kNHWC,
                  {kPool, shape_[0], shape_[1], shape_[2]}, sizeof(float));
    }
  }
  int64_t batch_size() const override { return batch_size_; }
  Shape sample_shape() const override { return shape_; }
  int64_t num_classes() const override { return classes_; }
  int64_t samples_per_epoch() const override { return samples_; }
  int64_t batches_per_epoch() const override { return (samples_ + batch_size_ - 1) / batch_size_; }
  void Start(int64_t epoch, int64_t batch) override {
    epoch_ = epoch;
    next_ = batch * batch_size_;
  }
  bool Next(Batch& out) override {
    if (next_ >= samples_) {
      if (!training_) return false;
      ++epoch_;
      next_ = 0;
    }
    int64_t n = std::min(batch_size_, samples_ - next_);
    const int64_t per = ShapeNumel(shape_);
    out.images.Resize({n, shape_[0], shape_[1], shape_[2]}, DType::kF32);
    out.images.set_format(channels_last_ ? MemoryFormat::kNHWC : MemoryFormat::kNCHW);
    out.labels.Resize({n}, DType::kI32);
    out.size = n;
    for (int64_t i = 0; i < n; ++i) {
      int64_t index = next_ + i;
      std::memcpy(out.images.data<float>() + i * per, pool_.data() + (index % kPool) * per,
                  per * sizeof(float));
      uint64_t key = HashCombine(HashCombine(seed_, epoch_), index);
      out.labels.data<int32_t>()[i] = static_cast<int32_t>(Mix64(key) % classes_);
    }
    next_ += n;
    return true;
  }
  SourceStats stats() const override { return {}; }

 private:
  static constexpr int64_t kPool = 8;
  Shape shape_;
  int64_t classes_, batch_size_, samples_ = 0;
  bool training_;
  bool channels_last_;
  uint64_t seed_;
  int64_t epoch_ = 0, next_ = 0;
  std::vector<float> pool_;
};

}  // namespace

std::unique_ptr<BatchSource> MakeSyntheticSource(const DataOptions& options, ShardSpec shard,
                                                 uint64_t seed, bool training) {
  return std::make_unique<SyntheticSource>(options, shard, seed, training);
}

}  // namespace cortado
