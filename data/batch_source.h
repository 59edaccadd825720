// BatchSource: where the trainer gets its batches (Fashion-MNIST IDX files, synthetic data,
// an LMDB of JPEGs). A source yields fixed-size batches of float32 (N, C, H, W) images, in NCHW
// memory or channels-last (DataOptions::channels_last: the tensor's format says which), and int32
// labels for one data-parallel rank.
//
// Positions: a training source is an endless stream of epochs; Start(epoch, batch) places it
// at a batch of an epoch (0 on a fresh run, the saved position on resume) and every batch
// after that is a pure function of (seed, epoch, position), so a resumed run sees exactly the
// batches an uninterrupted run would. An evaluation source makes one pass in file order; its
// last batch may be short, and so may a batch from which unreadable records were left out.
//
// Sharding: each epoch a permutation from (seed, epoch) is shared by all ranks; rank r takes
// positions r, r+W, r+2W, ... and every rank gets the same number of batches.
//
// Threads: Next() is called from the training thread; a source may decode ahead on its own
// threads (the loader), within the thread budget it was given.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/tensor/tensor.h"

namespace cortado {

struct Batch {
  Tensor images;  // f32 [N, C, H, W], NCHW or NHWC in memory (images.format())
  Tensor labels;  // i32 [N]; detection: the number of objects of each image
  // Detection only (undefined otherwise): the ground truth of the whole batch as Caffe SSD's
  // AnnotatedData layer gives it, f32 (1, 1, G, 8), G >= 0 objects, one row each:
  // [item_id, class_label, instance_id, xmin, ymin, xmax, ymax, difficult], item_id the image's
  // position in the batch, class_label 1..K (0 is the background), coordinates normalized to the
  // (augmented) image, difficult 0 or 1.
  Tensor boxes;
  // Detection only: i32 [N, 3], each image's record (its index in the database, in key order)
  // and its width and height as stored, before any transform: what turns normalized boxes into
  // the pixels of the original image (COCO results) and names the image.
  Tensor info;
  int64_t size = 0;  // samples, == N except in evaluation: a short last batch, or corrupt
                     // records left out (then maybe 0)
};

struct SourceStats {
  int64_t skipped_records = 0;    // corrupt records met: replaced (training), left out (eval)
  double wait_seconds = 0;        // time Next() spent waiting for data, summed
  int loader_threads = 0;         // decode threads, for sources that have them
  double loader_cpu_seconds = 0;  // CPU time those threads spent decoding, summed
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  virtual int64_t batch_size() const = 0;
  // Output sample shape {C, H, W}.
  virtual Shape sample_shape() const = 0;
  // Classes in the dataset (labels are in [0, num_classes)); -1 when unknown.
  virtual int64_t num_classes() const = 0;
  // Samples this rank sees per epoch (after sharding, padding or dropping).
  virtual int64_t samples_per_epoch() const = 0;
  // Batches per epoch for this rank; equal on every rank.
  virtual int64_t batches_per_epoch() const = 0;

  // Training: positions the stream at batch `batch` of epoch `epoch`.
  // Evaluation: rewinds to the first batch (epoch and batch must be 0).
  virtual void Start(int64_t epoch, int64_t batch) = 0;
  // Fills `out` with the next batch and returns true; false when an evaluation pass is done.
  virtual bool Next(Batch& out) = 0;

  virtual SourceStats stats() const = 0;
};

// The rank's place in data parallelism, for sharding.
struct ShardSpec {
  int rank = 0;
  int world_size = 1;
};

}  // namespace cortado
