// LMDB batch sources: ImageNet-style training and validation from a database of Caffe Datum
// records (written by `cortado convert`, or by Caffe's convert_imageset: encoded JPEG/PNG
// records, and raw BGR records with encoded=false).
//
// Training: each epoch a permutation from (seed, epoch) shared by all ranks, rank r taking
// positions r, r+W, ... (data/sharding.h); every sample is decoded and augmented
// (RandomResizedCrop, flip, normalize; data/transforms.h) on the loader's threads
// (data/loader.h), `prefetch` batches ahead. The crop and flip of a sample are a function of
// (seed, epoch, record index), so a resumed run sees exactly the batches an uninterrupted run
// would, whatever the thread count.
//
// Validation: rank r takes records r, r+W, ... in key order (the last batch may be short),
// resize + centre crop, normalize.
//
// Completeness: a database that `cortado convert` wrote must hold its completion record
// (DB/cortado-complete.json, data/lmdb.h) with the database's record count, else the source
// refuses it, naming the command that rebuilds it: a conversion that was killed part way must
// not be trained on as if it were the whole set. A database with neither a completion record
// nor Cortado's classes.txt / skipped.txt is taken as another tool's (Caffe's convert_imageset
// writes none of these) and read with a warning.
//
// A record that does not parse or decode is skipped with one warning (once per record, naming
// the first five) and counted in stats().skipped_records. Training replaces it by the next
// record in the database, so batch sizes and step counts stay the same on every rank.
// Evaluation leaves it out (its batch comes out smaller, even empty), so that every readable
// record is scored exactly once.
//
// Batches from Next() share the loader's buffers: they stay valid until the next Next() or
// Start() on the same source.
#pragma once

#include <memory>
#include <string>

#include "data/data_options.h"
#include "data/transforms.h"

namespace cortado {

std::unique_ptr<BatchSource> MakeLmdbTrainSource(const DataOptions& options, ShardSpec shard,
                                                 uint64_t seed);
std::unique_ptr<BatchSource> MakeLmdbEvalSource(const DataOptions& options, ShardSpec shard);

// The transform settings in DataOptions (mean/std: empty means ImageNet's, one value is
// repeated to three channels).
TransformOptions TransformOptionsFrom(const DataOptions& options);

// The samples an LMDB source yields: {3, crop, crop} (grey records are widened to RGB).
Shape LmdbSampleShape(const DataOptions& options);

// Labels in the database at `db` per its classes.txt (line i names label i); -1 without one.
int64_t ReadNumClasses(const std::string& db);

// Throws cortado::Error, naming `db` and the command that rebuilds it, when the database at `db`
// (holding `records` records) was written by `cortado convert` but lacks its completion record
// or disagrees with it (see above).
void CheckLmdbComplete(const std::string& db, int64_t records);

}  // namespace cortado
