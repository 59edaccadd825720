// Epoch order and data-parallel sharding, shared by every batch source.
//
// Each epoch all ranks compute the same permutation of [0, N) from (seed, epoch); rank r takes
// positions r, r+W, r+2W, ... of it. With drop_last the tail that does not fill a whole
// global batch (W * batch_size) is dropped; without it the order wraps around to pad the last
// global batch, so every rank always has the same number of full batches.
#pragma once

#include <cstdint>
#include <vector>

#include "data/batch_source.h"

namespace cortado {

class EpochSharder {
 public:
  EpochSharder(int64_t dataset_size, int64_t batch_size, ShardSpec shard, bool shuffle,
               bool drop_last, uint64_t seed);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t samples_per_epoch() const { return batches_per_epoch_ * batch_size_; }
  // The dataset indices of this rank's samples in `epoch`, in order (samples_per_epoch long).
  std::vector<int64_t> RankOrder(int64_t epoch) const;
  // The position in the epoch's shared permutation of this rank's k-th sample: the same
  // sample has the same position whatever the rank count (per-sample randomness keys on it).
  int64_t GlobalPosition(int64_t k) const { return shard_.rank + k * shard_.world_size; }

 private:
  int64_t dataset_size_;
  int64_t batch_size_;
  ShardSpec shard_;
  bool shuffle_;
  uint64_t seed_;
  int64_t batches_per_epoch_;
};

}  // namespace cortado
