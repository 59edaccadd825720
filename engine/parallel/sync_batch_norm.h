// SyncBatchNormReducer: the BatchStatsReducer of synchronized batch norm over a communicator of
// its own (a Split of the job's communicator: its group's ranks only, and never queued behind
// the gradient buckets of the data-parallel communicator, whose worker thread runs them while
// backward calls this one).
//
// Groups (distributed.sync_bn_group = g): ranks [k g, (k+1) g) share statistics; g = W is the
// whole job, g = 1 means per-rank statistics (then no reducer is made). The sums travel as f64.
// The values are host memory: a batch norm on a device copies its per-channel sums to the host
// (one copy), calls AllReduceSum, and copies them back (layers/batch_norm.h).
// Threads: called from the training thread only.
#pragma once

#include <memory>

#include "cortado/dist/communicator.h"
#include "engine/base/trace.h"
#include "engine/graph/layer.h"

namespace cortado {

class SyncBatchNormReducer final : public BatchStatsReducer {
 public:
  explicit SyncBatchNormReducer(std::unique_ptr<dist::Communicator> group);

  void AllReduceSum(double* values, int64_t count) override;
  int group_size() const override { return group_->size(); }

  // Seconds spent in AllReduceSum since the last call (and resets it).
  double TakeSeconds();
  void set_trace(Trace* trace) { trace_ = trace; }

 private:
  std::unique_ptr<dist::Communicator> group_;
  double seconds_ = 0;
  Trace* trace_ = nullptr;
};

}  // namespace cortado
