// DataParallel: the glue between Net and Solver that makes W ranks one training.
//
// Flat gradients. At construction every parameter gradient of the net is seated as a view into
// one block, in reverse layer order (the order in which backward finishes them), each starting
// on a 64-byte boundary. The block is cut into buckets of whole parameters: a small first
// bucket (first_bucket_mb) so that communication starts early in backward, bucket_mb each
// after it, and a small last bucket (last_bucket_mb): the net's first layers finish backward
// last, so nothing hides their all-reduce, and the less it carries the less is exposed.
// A bucket is a contiguous range of the block: it is all-reduced in place, with no packing copy.
// The cut itself is PlanBuckets (engine/parallel/bucket_plan.h), a pure function tested on its own.
// The block is the communicator's registered memory (RegisteredAllocator), registered once when
// it is allocated; over UCX with every rank on one host it is shared memory, and the buckets'
// all-reduces run the direct algorithm. Block and bucket table are allocated once, not per step.
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
// Gradient codecs. A parameter's Param::codec (set by the run's policy, "" = f32) says in which
// format its gradient travels (dist/codec.h); buckets never mix codecs, so a change of codec
// between neighbouring parameters starts a new bucket. A compressed bucket is averaged with
// Communicator::AllReduceCompressed (scaled by 1/W, then encoded at every hop). With error
// feedback each rank keeps a residual block beside the gradient block: what its encodings lost
// in one step is added to the next step's gradient before encoding (checkpoints keep it, per
// rank); a step that is skipped (DiscardStep) leaves it as it was. Stochastic rounding draws from
// (seed, step, bucket), so runs are reproducible.
//
// Auto codecs (distributed.codec: auto). Parameters whose Param::codec is "auto" are cut into
// buckets as a compressed codec's would be (batch norm and biases kept in f32 get buckets of
// their own), and each such bucket's codec is chosen from auto_codec.candidates by PlanCodecs
// (engine/parallel/codec_plan.h). Consecutive f32 buckets go out as one all-reduce (runs_, cut by
// MergeRuns with the bucket sizes), so a plan that keeps them in f32 pays no more all-reduces
// than plain f32. During the first warmup_steps steps the auto buckets travel in the
// widest candidate, and every rank records per bucket when backward made it ready and how long
// its all-reduce took for how many bytes; the first step is left out when there are two or
// more (allocation and connection set-up). Then the ranks agree on one set of numbers (a max
// all-reduce of the medians of the ready times and backward's end, and of the link model fitted
// to the transfers: latency and seconds per byte), rank 0 plans from them and sends the plan. Every
// `interval` iterations the same numbers are measured again since the last check and agreed: when
// the link's rate moved by more than replan_factor, or the exposed time measured exceeds what the
// plan predicts from those numbers (the hiding fraction then drops, NextHidingFraction), the
// buckets are planned again, and the accuracy guard runs: per bucket with error feedback the ratio
// of the residual's norm to the reduced gradient's norm (max over ranks); above max_residual_ratio
// the bucket is held one candidate wider than it travels in, from then on. Every decision comes
// from agreed numbers at an iteration every rank reaches, and rank 0 makes it and sends its outcome
// (the codecs, whether a trial runs, the numbers a later decision starts from) in one broadcast: no
// setting that only one rank has (link_override, CORTADO_AUTO_LINK) and no rounding that differs
// between CPUs can make ranks choose differently. So codecs change on every rank at the same step
// boundary (at the end of FinishStep, after the step's transfers). A bucket whose codec changes
// between one with error feedback and one without starts from a zero residual (what the last step
// lost in it is dropped). Rank 0 logs every plan and change; the trace gets a "codec plan" event;
// SaveState/LoadState keep the plan, the agreed numbers, the hiding fraction and the guard's floors
// (timing samples since the last check are not kept: a resumed run measures afresh).
//
// Trial. The plan's model prices bytes in link time only, but moving them also costs CPU that
// backward may need. After a plan made from measurements (the first, and a re-plan for a moved
// rate or more exposure than predicted) the plan and every auto bucket in its narrowest allowed
// codec take turns, a step each, trial_steps steps each; the ranks agree on every step's time
// (BeginStep to the end of FinishStep, max over ranks) and rank 0 keeps the all-narrowest plan when
// its steps ran faster than the plan's neighbouring ones (TrialPace, NarrowWinsTrial). A bucket
// that changes between a codec with error feedback and one without starts each turn from a zero
// residual, so the trial's lossy steps run without feedback. No check runs during a
// trial, and the timing samples start afresh after it. A checkpoint taken during a trial keeps
// the plan and a mark; the resumed run starts the trial over.
//
// Control words. Two elements after the last parameter ride in the last bucket, so every rank
// learns two things about the step without an extra round trip: the stop vote (a job must stop
// at the same step everywhere, and a signal reaches ranks at slightly different times) and the
// loss, whose average over ranks is the loss of the global batch (every rank's batch has the
// same size). SetControl writes them after forward; they are averaged like gradients, always in
// f32 (when the last parameters are compressed, the control words get an f32 bucket of their
// own).
//
// Devices. For a net on a device (Net::device(), a GPU or the test device) the block is device
// memory and the gradients views into it, while the all-reduces, the codecs and the error-feedback
// residuals run on the host, on a staging block of the same layout from the runtime's pinned
// allocator. When a bucket's parameters are ready its copy out (device -> staging, one per bucket)
// is queued behind the backward that finished it; a run is issued once its copies have reached
// the host, which the hook checks without waiting and FinishStep waits for, so the all-reduces
// still overlap backward. Without overlap every copy is queued in FinishStep. After each run is
// reduced its copies back are queued, ahead of the solver's step on the device's stream. The
// control words live in the staging block only. On the CPU the staging block is the block itself:
// no copy, no event.
//
// Threads: every call, and the hook, runs on the training thread; the all-reduces run on the
// communicator's worker thread. The communicator must not be used by anything else while a
// step is in flight (synchronized batch norm gets a communicator of its own).
//
// Files, one concept each: data_parallel.cpp (the block, buckets and runs, the step),
// data_parallel_codecs.cpp (codec policy, error-feedback residuals), data_parallel_auto_measure.cpp
// (codec auto's measurement and agreement), data_parallel_auto_decide.cpp (rank 0's plans, checks
// and trial), data_parallel_state.cpp (checkpoint state, start-up broadcast, same-job check).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cortado/dist/communicator.h"
#include "engine/base/trace.h"
#include "engine/graph/net.h"
#include "engine/io/checkpoint.h"
#include "engine/parallel/bucket_plan.h"
#include "engine/parallel/codec_plan.h"
#include "engine/tensor/caching_allocator.h"
#include "engine/tensor/registered_allocator.h"

namespace cortado {

// `distributed.codec: auto` (issue 29): which codec each bucket of parameters whose
// Param::codec is "auto" travels in, chosen online from measured timing (see "Auto codecs"
// above DataParallel).
struct AutoCodecOptions {
  bool enabled = false;
  // Widest first; the sub-16-bit ones run with error feedback.
  std::vector<dist::CodecKind> candidates = {dist::CodecKind::kF32, dist::CodecKind::kBF16,
                                             dist::CodecKind::kEpgc11, dist::CodecKind::kEpgc8};
  int64_t warmup_steps = 5;  // steps measured (in the widest candidate) before the plan
  int64_t interval = 50;     // check drift and the guard every this many iterations; 0: never
  double max_residual_ratio = 0.5;  // the guard: residual norm / gradient norm per bucket
  double replan_factor = 1.5;       // re-plan when the link's rate moved by more than this
  // The fraction of each bucket's measured hiding time the plan counts on (codec_plan.h,
  // "Margin"). A check that measures more exposed communication than the plan predicted
  // lowers it by a quarter and plans again.
  double hiding_fraction = 0.7;
  // Steps each side of the trial that follows a plan made from measurements: the plan and every
  // auto bucket in its narrowest allowed codec take turns, a step each, and the ranks keep the
  // faster by measured step time (codec_plan.h, "Trial"). 0: no trial. Never with link_override (a
  // fixed rate makes the plans reproducible; step times are not), nor on one rank.
  int64_t trial_steps = 4;
  // Tests: a trial even under link_override, so the plan on trial is fixed while the verdict is
  // timed.
  bool trial_under_link_override = false;
  // Replaces the agreed link model by a fixed rate (bytes/s, no latency) from each given
  // iteration on, (iteration, rate) in increasing iteration order: for tests, and to see the
  // plans a link would get (CORTADO_AUTO_LINK, see AutoLinkFromEnv). Empty: measured. Rank 0's
  // decides for every rank, like trial_steps and trial_under_link_override.
  std::vector<std::pair<int64_t, double>> link_override;
  // Ranks the plan is made for; 0: the communicator's (at least 2). `bench comm --codec auto`
  // plans on one rank for a job of several.
  int plan_world_size = 0;
};

// Parses CORTADO_AUTO_LINK ("RATE[,ITER:RATE]...", rates in bytes/s, e.g. "1e6,40:1e9": 1 MB/s,
// and 1 GB/s from iteration 40 on); unset or empty: none. Throws naming the variable.
std::vector<std::pair<int64_t, double>> AutoLinkFromEnv();

struct DataParallelOptions {
  double bucket_mb = 25;       // bucket size, MB (2^20 bytes) of gradients
  double first_bucket_mb = 1;  // the first bucket (the last layers' gradients)
  double last_bucket_mb = 1;   // the last bucket (the first layers'; its all-reduce is exposed)
  bool overlap = true;         // all-reduce buckets during backward (false: after it)
  dist::Rounding rounding = dist::Rounding::kNearest;  // for the compressed buckets
  bool error_feedback = false;  // keep what quantization lost and add it to the next step
  // Whether a step may be discarded (DiscardStep: a dynamic loss scale skips a step whose
  // gradients overflowed). Only then is a copy of the residual kept at each BeginStep: for
  // ResNet-50 a 100 MB copy per step and 100 MB of memory that fp32 training never reads.
  bool discardable_steps = false;
  uint64_t seed = 0;            // stochastic rounding's stream (with the step and the bucket)
  AutoCodecOptions auto_codec;  // distributed.codec: auto
};

class DataParallel : public CheckpointState {
 public:
  using Bucket = GradientBucket;  // engine/parallel/bucket_plan.h plans them

  // Seats the net's gradients in the flat block and attaches to its gradient-ready hook.
  // The net and communicator must outlive this object.
  DataParallel(Net& net, dist::Communicator& comm, DataParallelOptions options);
  // Waits for buckets still in flight (ignoring their errors) and detaches the hook.
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The all-reduces of a step: one per bucket, except under auto, where consecutive f32
  // buckets join (MergeRuns).
  const std::vector<IssueRun>& runs() const { return runs_; }
  const Tensor& gradient_block() const { return block_; }
  const DataParallelOptions& options() const { return options_; }
  // Bytes one rank sends per step (ring all-reduce: 2 (W-1)/W of each bucket's encoded size;
  // the direct one reads and writes as much in its peers' memory), and what they would be with
  // every bucket in f32.
  double wire_bytes_per_step() const;
  double f32_bytes_per_step() const;
  // The all-reduce algorithms the buckets run, distinct, in bucket order ("direct", "ring",
  // "halving_doubling"; "compressed ring" for buckets in a codec), for the start-up log.
  std::string bucket_algorithms() const;

  // Error feedback (options().error_feedback): this rank's residual block (f32, the gradient
  // block's layout), and every rank's, gathered (collective: every rank must call it; returns W
  // blocks on every rank). SetResidual restores this rank's block (same shape).
  const Tensor& residual() const { return residual_; }
  std::vector<Tensor> GatherResiduals();
  void SetResidual(const Tensor& residual);
  // Multiplies the residual by factor: a loss scaler changed the scale the gradients carry, and
  // what quantization lost must carry the new one (mixed precision with error feedback).
  void ScaleResidual(double factor);
  // The step's gradients are not applied (an overflow skipped it): the residual goes back,
  // bitwise, to what it was at BeginStep. Needs options().discardable_steps. Encoding folded the
  // old residual into gradients that are now discarded and kept what it lost of them; without this
  // the true residual would be lost and the error of a discarded step would feed the next one.
  void DiscardStep();

  // Checkpoint state: under distributed.codec: auto the codec plan (SaveCodecPlan); with error
  // feedback, every rank's residual ("error_feedback/rank<r>" and "error_feedback_ranks"), as
  // GatherForCheckpoint last gathered them or LoadState loaded them (rank 0 passes what it
  // loaded on to the others this way). Without either, nothing.
  void SaveState(Checkpoint& checkpoint) const override;
  // Collective: every rank must call it before the checkpoint is saved (on rank 0).
  void GatherForCheckpoint();
  // Each rank takes back its own residual. On another rank count the residuals no longer match
  // the ring's encoding sites, so their sum (what the last step lost in all) goes to rank 0,
  // with a warning; without error feedback they are dropped, with a warning. Rank 0 warns.
  void LoadState(const Checkpoint& checkpoint, const std::string& path) override;

  // Collective check that this rank runs the same job as rank 0: rank 0's `description` (text,
  // one item per line, e.g. the resolved config and the model's parameter shapes) is compared
  // line by line on every rank. On a mismatch every rank throws the same one-line error naming
  // the ranks that differ and, for each, the first line that differs.
  void VerifySameJob(const std::string& description);

  struct StepResult {
    bool stop = false;  // some rank voted to stop
    double loss = 0;    // mean of the ranks' losses (the loss of the global batch)
  };
  // step: the training iteration (seeds stochastic rounding).
  void BeginStep(int64_t step = 0);
  // This rank's loss of the step and its vote to stop after it; call after Forward, before
  // Backward issues the last bucket.
  void SetControl(double loss, bool stop_vote);
  // Issues the buckets not yet issued and waits for all.
  StepResult FinishStep();
  // Seconds FinishStep last waited for communication (the exposed communication time).
  double last_wait_seconds() const { return last_wait_s_; }
  // What the last step's buckets cost the communicator's worker thread: CPU time (total, user,
  // system; dist::Work::cpu) and wake-ups (sleeps waiting for the network, dist::Work::wakeups),
  // summed over the buckets; set by FinishStep. This is the rank's own CPU cost of communication,
  // beside the wall time it took (the kernel's softirq network path is not in it).
  const dist::ThreadCpu& last_comm_cpu() const { return last_comm_cpu_; }
  uint64_t last_comm_wakeups() const { return last_comm_wakeups_; }

  // distributed.codec: auto. Each bucket's codec now (the plan, when auto), comma-separated;
  // how many plans were made (the first included); the plan as a one-line summary.
  std::string codec_plan() const;
  int64_t codec_plans() const { return auto_plans_; }

  // Records each bucket's all-reduce (enqueue to done, with its CPU time and wake-ups) and the
  // wait of FinishStep; null: off.
  void set_trace(Trace* trace) { trace_ = trace; }

 private:
  // distributed.codec: auto's part of SaveState/LoadState: the plan, the agreed measurements
  // and the guard's floors (meta and tensors under "codec_auto"); a checkpoint without them
  // (written before the warmup ended) starts the warmup over. Nothing when auto is off.
  void SaveCodecPlan(Checkpoint& ckpt) const;
  void LoadCodecPlan(const Checkpoint& ckpt, const std::string& path);
  void OnGradientsReady(std::vector<Param>& params);
  // Issues the complete runs in order; on a device only those whose copies reached the host
  // staging, waiting for them when `wait`.
  void IssueReadyRuns(bool wait);
  void Issue(size_t run);
  // Cuts the buckets into issue runs: under auto, consecutive f32 buckets join (MergeRuns);
  // otherwise one run per bucket. Between steps only.
  void CutRuns();
  void WaitAll(bool rethrow);
  void SetControlWord(int i, double value);
  // Copies the compressed buckets' ranges of one residual block to another.
  void CopyCompressedRanges(const Tensor& from, Tensor& to) const;
  double ControlWord(int i) const;
  // Whether a bucket's all-reduce in `codec` keeps a residual (error feedback).
  bool UsesFeedback(dist::CodecKind codec) const;
  // Auto codecs: the step's timing goes into the samples; at the end of the warmup and at
  // every check the ranks agree and the plan may change.
  void MeasureStep(Trace::Clock::time_point backward_end, Trace::Clock::time_point step_end);
  std::vector<double> AgreedMeasurement();  // collective
  // Collective: rank 0 runs `decide` (it plans, logs and applies) and sends the outcome
  // (AutoState); every other rank adopts it, so no rank-local setting or rounding can make
  // the ranks' codecs or later collectives differ. An error rank 0 throws reaches every rank.
  void DecideOnRank0(const std::function<void()>& decide);
  // What rank 0 decides: the plan after the warmup, a check (the link override applied to the
  // agreed measurement `m` first), and a trial's verdict from the agreed step times.
  void FirstPlan(std::vector<double>& m);
  void AutoCheck(std::vector<double>& m);
  void EndTrial(const std::vector<double>& step_s);
  void ApplyLinkOverride(std::vector<double>& m) const;
  // The state decisions change, as numbers, and back (DecideOnRank0's message).
  std::vector<double> AutoState() const;
  void AdoptAutoState(const std::vector<double>& state);
  void ApplyPlan(const std::vector<dist::CodecKind>& codecs, const std::string& why);
  void TracePlan();                  // the "codec plan" trace event
  CodecPlanInput PlanInput() const;  // from the agreed numbers
  CodecPlanInput PlanInputFrom(const LinkModel& link, double backward_end_s,
                               const std::vector<double>& ready_s) const;
  // Empties the timing samples (a fresh window: one per bucket, no steps).
  void ResetSamples();
  // Takes an agreed measurement (AgreedMeasurement's layout) as the numbers plans are made from.
  void AdoptMeasurement(const std::vector<double>& m);
  // Sets the buckets' codecs (a residual starts from zero where feedback starts or stops) and
  // cuts the runs again. Between steps only.
  void SetCodecs(const std::vector<dist::CodecKind>& codecs);
  // The trial after a plan made from measurements (AutoCodecOptions::trial_steps): starts it
  // where it applies and the all-narrowest plan differs from the plan; TrialStep counts a step
  // of it, hands the next step to the other side and, at the end, agrees and keeps the faster.
  void StartTrial();
  void TrialStep(double step_s);

  // A net on a device (see "Devices" above DataParallel): bucket b's elements that travel
  // between the device block and the host staging (all but the control words); its copy out,
  // queued once per step; whether a run's copies have reached the host (waiting for them when
  // `wait`); the reduced run's copies back; and a wait for every copy out queued.
  int64_t CopiedElements(size_t b) const;
  void CopyOut(size_t b);
  bool OnHost(size_t run, bool wait);
  void CopyBack(size_t run);
  void WaitCopies(bool rethrow);

  Net& net_;
  dist::Communicator& comm_;
  DataParallelOptions options_;
  Device device_;  // the net's
  dist::DataType wire_type_ = dist::DataType::kF32;
  std::shared_ptr<RegisteredAllocator> allocator_ = std::make_shared<RegisteredAllocator>(comm_);
  Tensor block_;    // on the net's device
  Tensor staging_;  // on the host: block_ itself on the CPU, else pinned memory of its layout
  std::vector<std::unique_ptr<StreamEvent>> copied_;  // per bucket: its copy out (a device's)
  Tensor residual_;                                   // error feedback; empty when off
  Tensor residual_kept_;  // the residual as BeginStep found it (compressed buckets' ranges)
  std::vector<Tensor> saved_residuals_;  // every rank's, for SaveState (rank r's at r)
  int64_t step_ = 0;
  int64_t control_index_ = 0;  // [stop vote, loss]
  std::vector<Bucket> buckets_;
  std::vector<IssueRun> runs_;  // buckets issued together, in order
  std::unordered_map<const Param*, size_t> bucket_of_;
  // Per step:
  std::vector<int> pending_;                         // per bucket: parameters not yet ready
  std::vector<std::shared_ptr<dist::Work>> work_;    // per run
  std::vector<Trace::Clock::time_point> queued_at_;  // per run
  size_t next_run_ = 0;
  double last_wait_s_ = 0;
  dist::ThreadCpu last_comm_cpu_;
  uint64_t last_comm_wakeups_ = 0;
  Trace* trace_ = nullptr;
  Trace::Clock::time_point step_start_;
  std::vector<Trace::Clock::time_point> ready_at_;
  std::vector<bool> ready_seen_;
  bool feedback_all_ = false;  // distributed.error_feedback: every compressed bucket keeps one
  // Auto codecs.
  std::vector<bool> auto_bucket_;  // chosen by the plan (else fixed)
  struct Samples {
    std::vector<std::vector<double>> ready_s;     // per bucket, per step
    std::vector<double> backward_end_s;           // per step
    std::vector<double> ring_bytes, seconds;      // per transfer: (steps/W) bytes, duration
    std::vector<std::vector<double>> transfer_s;  // per bucket (its run's), per step
    std::vector<double> wait_s;                   // per step: exposed communication
    int64_t steps = 0;
  } samples_;
  bool planned_ = false;
  int64_t auto_plans_ = 0;
  LinkModel agreed_link_;  // what the plan was made with
  double agreed_backward_end_s_ = 0;
  std::vector<double> agreed_ready_s_;
  std::vector<double> measured_transfer_s_;  // per bucket, median of the last window
  std::vector<size_t> floor_;                // per bucket: the narrowest candidate index allowed
  double hiding_fraction_ = 1;               // what the plan counts on now (starts at the option)
  struct Trial {
    bool on = false;
    int64_t steps = 0;  // done; even: the plan's turn next, odd: the all-narrowest plan's
    std::vector<dist::CodecKind> plan, narrow;  // the two sides
    std::vector<double> step_s;                 // every step's time, in turn
  } trial_;
  bool trial_restart_ = false;  // resumed during a trial: rank 0 may start it over (MeasureStep)
};

// Which codec each parameter's gradient travels in (the `distributed:` codec keys): `codec` for
// all, except parameters of the kinds in keep_f32 (batch-norm scale and shift, biases: small,
// and sensitive to rounding); then the first override whose pattern (a glob, fnmatch(3), on the
// parameter name, e.g. "fc.*" or "*.bias") matches wins over both.
struct CodecPolicy {
  std::string codec = "f32";
  std::vector<ParamKind> keep_f32 = {ParamKind::kNorm, ParamKind::kBias};
  std::vector<std::pair<std::string, std::string>> overrides;  // (pattern, codec), in order
};
// Sets Param::codec of every parameter of the net; throws naming an unknown codec, or a
// pattern that matches no parameter (a typo would otherwise silently compress nothing).
void ApplyCodecPolicy(Net& net, const CodecPolicy& policy);

// The codec of a Param::codec string ("" = f32); throws naming the parameter.
dist::CodecKind CodecOfParam(const Param& param);

// The communicator's element type for a tensor dtype (f32, f64, f16, bf16, matched by name);
// throws naming `what` for the integer dtypes.
dist::DataType WireTypeOf(DType dtype, const std::string& what);

// Replaces *bytes with rank 0's bytes on every rank (its length first, then the bytes).
// Collective.
void BroadcastBytes(dist::Communicator& comm, std::string* bytes);

// The warning for a checkpoint with error-feedback residuals resumed without error feedback
// (DataParallel::LoadState, and a one-rank run, which has no DataParallel).
std::string ErrorFeedbackDropped(const std::string& path);

// Puts every rank in rank 0's starting state: rank 0 runs `make` (resume, initialize) and sends
// the checkpoint it returns; the others return it, parsed (named "rank 0's state" in errors),
// and rank 0 returns an empty one. Any exception that `make` throws reaches every rank as the
// same Error (its message) instead of a lost connection. Collective.
Checkpoint BroadcastState(dist::Communicator& comm, const std::function<Checkpoint()>& make);

}  // namespace cortado
