#include "engine/parallel/sync_batch_norm.h"

#include "engine/base/error.h"

namespace cortado {

SyncBatchNormReducer::SyncBatchNormReducer(std::unique_ptr<dist::Communicator> group)
    : group_(std::move(group)) {
  CORTADO_ASSERT(group_ != nullptr);
}

void SyncBatchNormReducer::AllReduceSum(double* values, int64_t count) {
  const auto t0 = Trace::Clock::now();
  group_->AllReduce(values, static_cast<size_t>(count), dist::DataType::kF64, dist::ReduceOp::kSum);
  const auto t1 = Trace::Clock::now();
  seconds_ += std::chrono::duration<double>(t1 - t0).count();
  if (trace_ != nullptr) {
    trace_->Add(TraceTrack::kBatchNorm, "batch-norm statistics", "comm", t0, t1,
                {{"values", static_cast<double>(count)}});
  }
}

double SyncBatchNormReducer::TakeSeconds() {
  double s = seconds_;
  seconds_ = 0;
  return s;
}

}  // namespace cortado
