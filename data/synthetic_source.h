// Synthetic data for benchmarks: random images and labels, generated once, so that a
// benchmark measures the engine rather than the disk or the decoder.
#pragma once

#include <memory>

#include "data/data_options.h"

namespace cortado {

std::unique_ptr<BatchSource> MakeSyntheticSource(const DataOptions& options, ShardSpec shard,
                                                 uint64_t seed, bool training);

}  // namespace cortado
