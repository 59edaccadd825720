// DataParallel: the glue between Net and Solver that makes W ranks one training.
//
// Flat gradients. At construction every parameter gradient of the net is seated as a view into
// one block, in reverse layer order (the order in which backward finishes them), each starting
// on a 64-byte boundary. The block is cut into buckets of whole parameters: a small first
// bucket (first_bucket_mb) so that communication starts early in backward, bucket_mb each
// after it, and a small last bucket (last_bucket_mb): the net's first layers finish backward
// last, so nothing hides their all-reduce, and the less it carries the less is exposed.
// A bucket is a contiguous range of the block: it is all-reduced in place, with no packing copy,
// and a transport that registers memory registers the block once. Block and bucket table are
// allocated once, not per step.
//
// One step:  BeginStep  ->  Net::Forward, SetControl, Net::Backward  ->  FinishStep  -> solver.
// During backward the net's gradient-ready hook counts each bucket's parameters down. With
// overlap on, a complete bucket is handed to the communicator's worker thread at once and
// averaged over the ranks (ReduceOp::kAvg: the sum divided by W once, by the rank that owns
// each element) while backward continues on earlier layers. Buckets are issued in index order
// (every rank must issue the same operations in the same order). FinishStep issues whatever is
// left and waits for every bucket; the time it waits is the exposed communication time. With
// overlap off the same buckets are issued back to back after backward: the two modes run the
// same operations on the same data and give bitwise identical results; they differ only in
// time, which is what the scaling experiment measures.
//
// Control words. Two elements after the last parameter ride in the last bucket, so every rank
// learns two things about the step without an extra round trip: the stop vote (a job must stop
// at the same step everywhere, and a signal reaches ranks at slightly different times) and the
// loss, whose average over ranks is the loss of the global batch (every rank's batch has the
// same size). SetControl writes them after forward; they are averaged like gradients.
//
// Threads: every call, and the hook, runs on the training thread; the all-reduces run on the
// communicator's worker thread. The communicator must not be used by anything else while a
// step is in flight (synchronized batch norm gets a communicator of its own).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cortado/dist/communicator.h"
#include "engine/net.h"
#include "engine/trace.h"

namespace cortado {

struct DataParallelOptions {
  double bucket_mb = 25;       // bucket size, MB (2^20 bytes) of gradients
  double first_bucket_mb = 1;  // the first bucket (the last layers' gradients)
  double last_bucket_mb = 1;   // the last bucket (the first layers'; its all-reduce is exposed)
  bool overlap = true;         // all-reduce buckets during backward (false: after it)
};

class DataParallel {
 public:
  struct Bucket {
    int64_t begin = 0, end = 0;   // element range in the gradient block
    int params = 0;               // parameters in it
    std::string first, last;      // names of its first and last parameter (for logs)
  };

  // Seats the net's gradients in the flat block and attaches to its gradient-ready hook.
  // The net and communicator must outlive this object.
  DataParallel(Net& net, dist::Communicator& comm, DataParallelOptions options);
  // Waits for buckets still in flight (ignoring their errors) and detaches the hook.
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Tensor& gradient_block() const { return block_; }
  const DataParallelOptions& options() const { return options_; }

  // Collective check that this rank runs the same job as rank 0: rank 0's `description` (text,
  // one item per line, e.g. the resolved config and the model's parameter shapes) is compared
  // line by line on every rank. On a mismatch every rank throws the same one-line error naming
  // the ranks that differ and, for each, the first line that differs.
  void VerifySameJob(const std::string& description);

  struct StepResult {
    bool stop = false;  // some rank voted to stop
    double loss = 0;    // mean of the ranks' losses (the loss of the global batch)
  };
  void BeginStep();
  // This rank's loss of the step and its vote to stop after it; call after Forward, before
  // Backward issues the last bucket.
  void SetControl(double loss, bool stop_vote);
  // Issues the buckets not yet issued and waits for all.
  StepResult FinishStep();
  // Seconds FinishStep last waited for communication (the exposed communication time).
  double last_wait_seconds() const { return last_wait_s_; }

  // Records each bucket's all-reduce (enqueue to done) and the wait of FinishStep; null: off.
  void set_trace(Trace* trace) { trace_ = trace; }

 private:
  void OnGradientsReady(std::vector<Param>& params);
  void IssueReadyBuckets();
  void Issue(size_t bucket);
  void WaitAll(bool rethrow);
  void SetControlWord(int i, double value);
  double ControlWord(int i) const;

  Net& net_;
  dist::Communicator& comm_;
  DataParallelOptions options_;
  dist::DataType wire_type_ = dist::DataType::kF32;
  Tensor block_;
  int64_t control_index_ = 0;  // [stop vote, loss]
  std::vector<Bucket> buckets_;
  std::unordered_map<const Param*, size_t> bucket_of_;
  // Per step:
  std::vector<int> pending_;  // parameters of each bucket not yet ready
  std::vector<std::shared_ptr<dist::Work>> work_;
  std::vector<Trace::Clock::time_point> queued_at_;
  size_t next_issue_ = 0;
  double last_wait_s_ = 0;
  Trace* trace_ = nullptr;
};

// The dtype of the communicator for a tensor dtype (f32, f64); throws for others.
dist::DataType WireTypeOf(DType dtype, const std::string& what);

// Replaces *bytes with rank 0's bytes on every rank (its length first, then the bytes).
// Collective.
void BroadcastBytes(dist::Communicator& comm, std::string* bytes);

}  // namespace cortado
