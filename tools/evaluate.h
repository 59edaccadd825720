// Evaluation: one pass of the net in test phase over a validation source, the piece that
// `cortado train` (at eval_interval and at the end) and `cortado eval` share.
//
// With a communicator every rank passes its own shard and all get the totals of all shards.
// Ranks move through the pass in lock step: before each batch they exchange one small vector
// (a stop vote, whether they still have a batch, the images of the round), so a Ctrl-C that
// reaches any rank abandons the evaluation on every rank at the same batch, and rank 0 knows
// the whole job's progress for its progress line. Shards may differ by a batch; a rank whose
// shard is done keeps voting until every rank's is.
#pragma once

#include <atomic>
#include <cstdint>

#include "cortado/dist/communicator.h"
#include "data/batch_source.h"
#include "engine/graph/net.h"
#include "tools/detection_eval.h"

namespace cortado {

// Points the net's inputs at the batch (no copy: the net reads them during this step only); an
// f64 net gets a converted copy; a net on a device gets the batch staged through pinned memory
// (tools/device_feed.h). Throws when the images do not fit the net's input.
void FeedBatch(Net& net, const Batch& batch);

struct EvalResult {
  double top1 = 0, top5 = 0, loss = 0;  // fractions in [0, 1]; mean loss per image
  // A detector (a net with a DetectionOutput layer and a source with boxes): the metrics of the
  // whole pass over every rank's images; top1 and top5 stay 0. map50 is VOC's mAP@0.5 (the
  // VOC2007 11-point average), map COCO's mAP@[.5:.95].
  bool detection = false;
  detection::DetectionMetrics metrics;
  double map50 = 0, map = 0;
  int64_t images = 0;
  int64_t skipped = 0;  // unreadable records left out (the source names them in warnings)
  // A stop (Ctrl-C) on some rank abandoned the pass: the figures cover `images` only.
  bool interrupted = false;
  int64_t batches = 0;        // batches evaluated (per rank, the ranks in lock step)
  int64_t total_batches = 0;  // what a whole pass takes (the longest shard's)
};

struct EvalControl {
  // Polled before every batch; true on any rank stops the pass on every rank (null: never).
  const std::atomic<bool>* stop = nullptr;
  // Rank 0 logs "eval  batch 40/200 ..." once the pass has run this long, and again each time
  // as long again has passed (0: never).
  double progress_seconds = 5;
  // Detection: when set, rank 0 receives every rank's detections here (in the order of the
  // images' records, so W ranks write what one process writes); other ranks' stay empty.
  detection::CocoResults* results = nullptr;
};

// Runs the net in test phase over one pass of `source` and restores the previous phase. The
// counts of correct images are integers, so a data-parallel evaluation equals a one-process
// one exactly, skipped records included. A detector's accumulators are gathered from every
// rank and merged (detection_eval.h), which is exact as well. Collective with a communicator
// of several ranks.
EvalResult Evaluate(Net& net, BatchSource& source, dist::Communicator* comm = nullptr,
                    const EvalControl& control = EvalControl{});

}  // namespace cortado
