#include "data/data_options.h"
#include "data/idx_source.h"
#include "data/lmdb_source.h"
#include "data/synthetic_source.h"
#include "engine/base/error.h"

namespace cortado {

namespace {

// Detection reads Caffe SSD records from an LMDB; the other sources hold labelled images only.
void CheckTask(const DataOptions& options) {
  CORTADO_CHECK(options.task != "detection" || options.type == "lmdb",
                "data.task: detection reads an LMDB of detection records (data.type: lmdb), not ",
                options.type);
}

}  // namespace

std::unique_ptr<BatchSource> MakeTrainSource(const DataOptions& options, ShardSpec shard,
                                             uint64_t seed) {
  CheckTask(options);
  if (options.type == "idx") return MakeIdxTrainSource(options, shard, seed);
  if (options.type == "lmdb") return MakeLmdbTrainSource(options, shard, seed);
  if (options.type == "synthetic") return MakeSyntheticSource(options, shard, seed, true);
  Fail("data.type: unknown source type '", options.type, "' (known: idx, lmdb, synthetic)");
}

std::unique_ptr<BatchSource> MakeEvalSource(const DataOptions& options, ShardSpec shard) {
  CheckTask(options);
  if (options.type == "idx") return MakeIdxEvalSource(options, shard);
  if (options.type == "lmdb") return MakeLmdbEvalSource(options, shard);
  if (options.type == "synthetic") return MakeSyntheticSource(options, shard, 0, false);
  Fail("data.type: unknown source type '", options.type, "' (known: idx, lmdb, synthetic)");
}

}  // namespace cortado
