// Which codec each gradient bucket travels in when `distributed.codec: auto` chooses (issue 29's
// planner): a pure function of what the ranks measured and agreed on, so the rules can be tested
// as a table. Rank 0 plans and sends the outcome to the other ranks (DataParallel), so a plan
// never differs between ranks; the file is built without contracted multiply-adds
// (engine/CMakeLists.txt), so the same numbers also give the same plan on another CPU (a run
// resumed elsewhere, `bench comm --codec auto`).
//
// Model. Backward makes bucket b ready at ready_s (seconds from the start of backward) and ends
// at backward_end_s. The communicator runs the buckets' all-reduces one after another in bucket
// order, so bucket b's transfer starts at max(its ready time, the previous one's finish) and
// takes the link model's time for its encoded bytes. Communication ends when the last transfer
// finishes; the time past the end of backward is exposed.
//
// Rule. Every bucket in the narrowest candidate, or every one in the widest, ends communication
// soonest (the narrowest sends the fewest bytes; with joined f32 runs and a latency per
// all-reduce the widest can end sooner); call the sooner of the two E. The planner walks the
// buckets in order and gives each the widest candidate that, with every later bucket in the
// narrowest or every later one in the widest, still ends communication by max(E, the end of
// backward): no choice exposes more than the better of those two plans would, and precision
// goes to the buckets with backward left to hide them. On a fast link every bucket but the
// last-ready ones keeps f32; on a slow one the first-ready bucket keeps the most, and the queue
// pushes the later ones narrower; the last bucket, ready when backward ends, gets the narrowest
// unless its transfer is free.
//
// Margin. The hiding times are measured in the warmup, with every bucket in the widest
// candidate beside backward; under a narrower plan backward runs at another speed, and a plan
// that fills every hiding time exactly exposes whatever the measurement missed. The choice
// therefore counts on hiding_fraction of each bucket's measured hiding time (its ready time
// moved that much closer to the end of backward); predictions (PlannedBucket, ScheduleCodecs)
// use the measured times as they are.
//
// Runs. Under `codec: auto` consecutive f32 buckets are issued as one all-reduce (MergeRuns,
// engine/parallel/bucket_plan.h); with merge_f32 the queue is one of runs: a run starts as its last
// bucket is ready and carries the bytes of all of them.
//
// Trial. The model prices bytes in link time only; moving them also costs CPU (the kernel's
// network path, copies, on an emulated link the other end's stack too), which slows backward on
// a machine with no core to spare. So a plan made from measurements runs for a few steps in turn
// with the all-narrowest plan, and the ranks keep the faster by measured step time (TrialPace,
// NarrowWinsTrial); on a tie the plan wins, for its precision.
//
// Guard. A lossy codec's error-feedback residual grows relative to the gradient where the codec
// is too coarse for the bucket's values; Widen moves each bucket whose measured ratio exceeds the
// limit one candidate wider.
#pragma once

#include <string>
#include <vector>

#include "cortado/dist/codec.h"
#include "engine/parallel/bucket_plan.h"

namespace cortado {

// Time of one all-reduce of `bytes` on W ranks (a ring: 2 (W - 1) steps, each a latency and
// 1/W of the bytes): 2 (W - 1) * latency_s + 2 (W - 1) / W * bytes / bytes_per_s.
struct LinkModel {
  double latency_s = 0;
  double bytes_per_s = 0;
  double AllReduceSeconds(double bytes, int world_size) const;
};

// The link model from measured all-reduces: ring_bytes[i] (2 (W - 1) / W of transfer i's bytes)
// took seconds[i]. The rate is the least-squares slope over the samples at or below the median
// residual of a first fit over all (where a slope is not positive, the mean rate); the latency is
// the lower envelope, what the quickest transfer left beyond its bytes (never negative): a
// transfer's time also holds the wait for the slowest rank to issue it, which a least-squares
// intercept would read as latency. Empty samples: a zero model.
LinkModel FitLink(const std::vector<double>& ring_bytes, const std::vector<double>& seconds,
                  int world_size);

struct BucketTiming {
  double ready_s = 0;    // when backward made the bucket ready, from backward's start
  double f32_bytes = 0;  // its gradients in f32
  // A bucket the plan does not choose for (batch norm and biases kept in f32, a codec set by
  // an override, the control words): it always travels in `codec`, and the plan queues the
  // others around it.
  bool fixed = false;
  dist::CodecKind codec = dist::CodecKind::kF32;
};

struct CodecPlanInput {
  std::vector<BucketTiming> buckets;  // in issue order
  double backward_end_s = 0;
  int world_size = 2;
  LinkModel link;
  std::vector<dist::CodecKind> candidates;  // widest first, e.g. f32, bf16, epgc11, epgc8
  double hiding_fraction = 1.0;  // of each measured hiding time the choice counts on, (0, 1]
  bool merge_f32 = false;        // consecutive f32 buckets travel as one all-reduce...
  BucketSizes merge_sizes;       // ... joined by these sizes (MergeRuns)
};

struct PlannedBucket {
  dist::CodecKind codec = dist::CodecKind::kF32;
  double start_s = 0, finish_s = 0;  // the predicted transfer, in the plan's queue
  bool hidden = false;               // finishes by the end of backward
};

// Throws naming what is wrong: no candidates, a candidate list not ordered widest first, a
// non-positive rate or world size, a hiding fraction outside (0, 1].
std::vector<PlannedBucket> PlanCodecs(const CodecPlanInput& input);

// The predicted transfers of the buckets in the given codecs (one per bucket; fixed buckets
// travel in theirs whatever `codecs` says), queued as PlanCodecs queues them.
std::vector<PlannedBucket> ScheduleCodecs(const CodecPlanInput& input,
                                          const std::vector<dist::CodecKind>& codecs);

// The hiding fraction after a check that measured `exposed_s` of communication past the end of
// backward (backward_end_s) where the plan predicted `predicted_s` from the same measurements:
// a quarter lower when the excess is more than 5% of backward plus 1 ms (the plan counted on
// hiding that was not there), else unchanged; never below 0.05.
double NextHidingFraction(double fraction, double exposed_s, double predicted_s,
                          double backward_end_s);

// The median (the mean of the middle two for an even count); empty: 0.
double Median(std::vector<double> v);

// A trial side's step time, for the log: the median of its steps, the first left out when there
// are two or more. Empty: 0.
double TrialStepSeconds(const std::vector<double>& step_s);

// A trial's verdict. The two sides run in turn, step by step (the plan, the all-narrowest, the
// plan, ...), so each pair of neighbouring steps sees the same machine: a drift in speed (another
// process, a queue on the link) cancels in the pair's ratio where it would not between two blocks
// of steps. The pace is the median over pairs of the narrowest step's time over the plan's, the
// first pair left out when there are two or more (it pays for the first change of codecs). No
// pair: 1.
double TrialPace(const std::vector<double>& plan_step_s, const std::vector<double>& narrow_step_s);

// Whether a trial keeps the all-narrowest plan: it ran faster (pace below 1). On a tie the plan
// stays, for its precision.
bool NarrowWinsTrial(double pace);

// One candidate wider for every bucket whose residual ratio (error-feedback residual norm over
// gradient norm) is above max_ratio; buckets already in the widest stay.
std::vector<dist::CodecKind> Widen(const std::vector<dist::CodecKind>& codecs,
                                   const std::vector<double>& residual_ratios, double max_ratio,
                                   const std::vector<dist::CodecKind>& candidates);

// The codecs by name, comma-separated ("epgc11,f32,epgc8"): how DataParallel logs a plan, writes
// it in the trace and keeps it in a checkpoint (codec_auto_plan).
std::string CodecPlanText(const std::vector<dist::CodecKind>& codecs);

}  // namespace cortado
