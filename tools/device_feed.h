// Batches onto a device without stalling it: each batch is converted and reordered on the host
// straight into pinned memory (the device runtime's PinnedHostAllocator) and copied to the device
// asynchronously: a copy from pinned memory returns once queued, and the pinned cache hands the
// block out again only after the device has read it. The trainer stages step t+1's batch while
// step t's backward runs on the device (Trainer::ForwardBackward), so the copy and the host work
// before it overlap the step.
#pragma once

#include "data/batch_source.h"
#include "engine/graph/net.h"

namespace cortado {

// A batch in device memory, in the net's input dtype and layout, its copy possibly still queued.
struct StagedBatch {
  Tensor images;  // the net's "data" input
  Tensor labels;  // the net's "label" input: the labels, or a detector's ground-truth boxes
  bool defined() const { return images.defined(); }
};

// Throws when the batch's images do not fit the net's input (the message names both shapes).
void CheckBatchFitsNet(Net& net, const Batch& batch);

// `batch` (host memory) staged for `net` (on a device): returns when both copies are queued.
StagedBatch StageBatch(Net& net, const Batch& batch);

// Points the net's inputs at a staged batch (work queued after its copies on the device's stream).
void FeedStaged(Net& net, StagedBatch staged);

}  // namespace cortado
