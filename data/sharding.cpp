#include "data/sharding.h"

#include <numeric>

#include "engine/base/error.h"
#include "engine/base/random.h"

namespace cortado {

EpochSharder::EpochSharder(int64_t dataset_size, int64_t batch_size, ShardSpec shard, bool shuffle,
                           bool drop_last, uint64_t seed)
    : dataset_size_(dataset_size),
      batch_size_(batch_size),
      shard_(shard),
      shuffle_(shuffle),
      seed_(seed) {
  CORTADO_CHECK(batch_size > 0, "batch size must be positive, got ", batch_size);
  CORTADO_CHECK(shard.world_size >= 1 && shard.rank >= 0 && shard.rank < shard.world_size,
                "bad shard: rank ", shard.rank, " of ", shard.world_size);
  CORTADO_CHECK(dataset_size > 0, "the dataset is empty");
  const int64_t global_batch = batch_size * shard.world_size;
  batches_per_epoch_ =
      drop_last ? dataset_size / global_batch : (dataset_size + global_batch - 1) / global_batch;
  CORTADO_CHECK(batches_per_epoch_ > 0, "the dataset has ", dataset_size,
                " samples, fewer than one global batch (", batch_size, " x ", shard.world_size,
                " ranks); lower data.batch_size or set data.drop_last: false");
}

std::vector<int64_t> EpochSharder::RankOrder(int64_t epoch) const {
  std::vector<int64_t> perm(dataset_size_);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (shuffle_) {
    // Fisher-Yates driven by a generator seeded from (seed, epoch): same on every rank.
    Rng rng(HashCombine(seed_, static_cast<uint64_t>(epoch) + 0x5348554646ull));
    for (int64_t i = dataset_size_ - 1; i > 0; --i) {
      int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
      std::swap(perm[i], perm[j]);
    }
  }
  const int64_t per_rank = samples_per_epoch();
  std::vector<int64_t> order(per_rank);
  for (int64_t k = 0; k < per_rank; ++k) {
    order[k] = perm[GlobalPosition(k) % dataset_size_];  // wraps only when padding
  }
  return order;
}

}  // namespace cortado
