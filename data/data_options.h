// DataOptions: the `data:` section of the config, resolved and validated by engine/config,
// and the factory that turns it into batch sources.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch_source.h"

namespace cortado {

struct DataOptions {
  std::string type = "idx";  // idx | lmdb | synthetic
  // classification | detection (type lmdb: Caffe SSD AnnotatedDatum records; batches carry
  // Batch::boxes, data/detection_transforms.h augments them)
  std::string task = "classification";
  std::string train;           // idx: folder with train-images-idx3-ubyte[.gz]; lmdb: DB folder
  std::string val;             // idx: folder with t10k-*; lmdb: DB folder
  int64_t batch_size = 64;     // per rank
  int64_t val_batch_size = 0;  // 0: same as batch_size
  int threads = 0;             // decode threads; 0: the thread budget
  int prefetch = 4;            // batches decoded ahead
  bool shuffle = true;         // reshuffle every epoch from (seed, epoch)
  bool flip = false;           // random horizontal flip in training (config default: detection on)
  bool drop_last = true;       // sharding: drop the tail (true) or pad by wrapping (false)
  std::vector<double> mean;    // per channel, in [0,1] pixel units; empty: dataset default
  std::vector<double> std;     // per channel; empty: dataset default

  // lmdb (ImageNet-style) transforms
  int64_t crop = 224;        // output side for training and validation
  int64_t val_resize = 256;  // validation: resize shorter side to this, then center crop
  double scale_min = 0.08, scale_max = 1.0;             // RandomResizedCrop area fraction
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // RandomResizedCrop aspect ratio

  // detection (task: detection)
  int64_t resize = 300;           // output width and height, training and evaluation
  std::string label_map;          // Caffe SSD label map naming the classes; "": the database's
                                  // classes.txt, else its labelmap.prototxt
  bool distort = true;            // photometric distortion
  bool expand = true;             // zoom out onto a mean-coloured canvas
  double max_expand_ratio = 4.0;  // of that canvas
  bool iou_crop = true;           // SSD's IoU-constrained random crop

  // synthetic: random images of this shape, for benchmarks
  std::vector<int64_t> synthetic_shape = {3, 224, 224};
  int64_t synthetic_classes = 1000;
  int64_t synthetic_samples = 12800;
  int64_t synthetic_val_samples = 0;  // evaluation samples; 0: no evaluation

  // Not a config key: set by the tools from the net's layout (model.layout). Sources then write
  // their images channels-last (HWC per sample, batches labeled MemoryFormat::kNHWC), as the net
  // reads them, so no reorder runs per batch; decoded JPEGs are HWC already.
  bool channels_last = false;
};

// Whether the options name data to evaluate on: data.val, or synthetic validation samples.
inline bool HasValidation(const DataOptions& o) {
  return !o.val.empty() || (o.type == "synthetic" && o.synthetic_val_samples > 0);
}

std::unique_ptr<BatchSource> MakeTrainSource(const DataOptions& options, ShardSpec shard,
                                             uint64_t seed);
std::unique_ptr<BatchSource> MakeEvalSource(const DataOptions& options, ShardSpec shard);

}  // namespace cortado
