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
// Detection (data.task: detection): the records are Caffe SSD AnnotatedDatums (written by
// `cortado convert` from VOC or COCO, or by Caffe SSD's convert_annoset); every sample goes
// through SSD's augmentation (data/detection_transforms.h; evaluation: resize only), and each
// batch carries Batch::boxes, the (1, 1, G, 8) ground truth of its images, with Batch::labels
// the number of objects of each image. Corrupt records are handled as above; an object whose
// label is outside the label map stops the run.
//
// Batches from Next() share the loader's buffers: they stay valid until the next Next() or
// Start() on the same source.
#pragma once

#include <memory>
#include <string>

#include "data/data_options.h"
#include "data/detection_transforms.h"
#include "data/transforms.h"

namespace cortado {

std::unique_ptr<BatchSource> MakeLmdbTrainSource(const DataOptions& options, ShardSpec shard,
                                                 uint64_t seed);
std::unique_ptr<BatchSource> MakeLmdbEvalSource(const DataOptions& options, ShardSpec shard);

// The transform settings in DataOptions (mean/std: empty means ImageNet's, one value is
// repeated to three channels).
TransformOptions TransformOptionsFrom(const DataOptions& options);

// The detection transform settings (data.resize, the augmentation switches; mean/std: empty
// means torchvision's ssd300_vgg16 normalization).
DetectionTransformOptions DetectionTransformOptionsFrom(const DataOptions& options);

// The samples an LMDB source yields: {3, crop, crop} (detection: {3, resize, resize}); grey
// records are widened to RGB.
Shape LmdbSampleShape(const DataOptions& options);

// Detection: labels (K + 1, the background included) per data.label_map, else the database's
// classes.txt, else its labelmap.prototxt; -1 without any.
int64_t DetectionNumClasses(const DataOptions& options, const std::string& db);

// Labels in the database at `db` per its classes.txt (line i names label i); -1 without one.
int64_t ReadNumClasses(const std::string& db);

// Throws cortado::Error, naming `db` and the command that rebuilds it, when the database at `db`
// (holding `records` records) was written by `cortado convert` but lacks its completion record
// or disagrees with it (see above).
void CheckLmdbComplete(const std::string& db, int64_t records);

}  // namespace cortado
