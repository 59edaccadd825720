// distributed.codec: auto in DataParallel (data_parallel.h, "Auto codecs" and "Trial"), what rank
// 0 decides from the agreed numbers: the plan after the warmup, each check (a re-plan for a moved
// link rate or more exposure than predicted, and the accuracy guard), the trial that follows a
// plan made from measurements, and applying a plan (its log lines and trace event).
#include <algorithm>
#include <cstdio>

#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/parallel/data_parallel.h"

namespace cortado {
namespace {

std::string Fixed(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, v);
  return text;
}

std::string Ms(double seconds) { return StrCat(Fixed(1000 * seconds, 1), " ms"); }

// Bytes in MB (2^20), one decimal; below 0.1 MB in KB.
std::string Bytes(double bytes) {
  return bytes < 0.1 * 1048576 ? StrCat(Fixed(bytes / 1024, 1), " KB")
                               : StrCat(Fixed(bytes / 1048576, 1), " MB");
}

}  // namespace

void DataParallel::FirstPlan(std::vector<double>& m) {
  const size_t n = buckets_.size();
  ApplyLinkOverride(m);
  AdoptMeasurement(m);
  measured_transfer_s_.assign(m.begin() + 3 + 2 * static_cast<int64_t>(n),
                              m.begin() + 3 + 3 * static_cast<int64_t>(n));
  CORTADO_CHECK(agreed_link_.bytes_per_s > 0,
                "codec auto: the warmup measured no transfer to plan from");
  planned_ = true;
  std::vector<dist::CodecKind> codecs;
  for (const PlannedBucket& p : PlanCodecs(PlanInput())) codecs.push_back(p.codec);
  ApplyPlan(codecs, "after the warmup");
  StartTrial();
}

void DataParallel::AutoCheck(std::vector<double>& m) {
  const AutoCodecOptions& ac = options_.auto_codec;
  const size_t n = buckets_.size();
  ApplyLinkOverride(m);
  measured_transfer_s_.assign(m.begin() + 3 + 2 * static_cast<int64_t>(n),
                              m.begin() + 3 + 3 * static_cast<int64_t>(n));
  std::vector<dist::CodecKind> codecs;
  for (const Bucket& b : buckets_) codecs.push_back(b.codec);
  std::string why;
  bool replanned = false;
  if (m[1] > 0) {
    const double rate = 1.0 / m[1];
    const double drift = rate / agreed_link_.bytes_per_s;
    // The plan's prediction with the numbers just measured under it, against the exposure
    // measured: more than predicted means the plan counted on hiding that was not there.
    const double exposed = m[3 + 3 * n];
    const std::vector<double> ready(m.begin() + 3, m.begin() + 3 + static_cast<int64_t>(n));
    const std::vector<PlannedBucket> now =
        ScheduleCodecs(PlanInputFrom(LinkModel{m[0], rate}, m[2], ready), codecs);
    const double predicted = std::max(0.0, (now.empty() ? 0.0 : now.back().finish_s) - m[2]);
    const double fraction = exposed < 0
                                ? hiding_fraction_
                                : NextHidingFraction(hiding_fraction_, exposed, predicted, m[2]);
    if (std::max(drift, 1 / drift) > ac.replan_factor) {
      why = StrCat("the link's rate moved from ", Bytes(agreed_link_.bytes_per_s), "/s to ",
                   Bytes(rate), "/s");
    }
    if (fraction != hiding_fraction_) {
      why += StrCat(why.empty() ? "" : "; ", "exposed ", Ms(exposed), " where the plan predicted ",
                    Ms(predicted), ": it now counts on ", Fixed(fraction, 2),
                    " of the hiding time (was ", Fixed(hiding_fraction_, 2), ")");
      hiding_fraction_ = fraction;
    }
    // Nothing to re-plan for: the plan keeps the numbers it was made with.
    replanned = !why.empty();
    if (replanned) {
      AdoptMeasurement(m);
      codecs.clear();
      for (const PlannedBucket& p : PlanCodecs(PlanInput())) codecs.push_back(p.codec);
    }
  }
  // The guard: a bucket whose residual ratio is above the limit is held one candidate wider
  // than it travels in now, from here on.
  std::vector<dist::CodecKind> now;
  std::vector<double> ratios(n, 0.0);  // fixed buckets: never widened
  for (size_t b = 0; b < n; ++b) {
    now.push_back(buckets_[b].codec);
    if (auto_bucket_[b]) ratios[b] = m[3 + n + b];
  }
  const std::vector<dist::CodecKind> wider =
      Widen(now, ratios, ac.max_residual_ratio, ac.candidates);
  std::string tripped;
  for (size_t b = 0; b < n; ++b) {
    if (wider[b] == now[b]) continue;
    const size_t at = static_cast<size_t>(
        std::find(ac.candidates.begin(), ac.candidates.end(), wider[b]) - ac.candidates.begin());
    floor_[b] = std::min(floor_[b], at);
    tripped += StrCat(tripped.empty() ? "" : ", ", b, " (", Fixed(ratios[b], 3), ")");
  }
  if (!tripped.empty()) {
    why += StrCat(why.empty() ? "" : "; ", "residual/gradient above ", ac.max_residual_ratio,
                  " in bucket(s) ", tripped);
  }
  for (size_t b = 0; b < n; ++b) {
    if (!auto_bucket_[b]) continue;
    const size_t at = static_cast<size_t>(
        std::find(ac.candidates.begin(), ac.candidates.end(), codecs[b]) - ac.candidates.begin());
    if (at > floor_[b]) codecs[b] = ac.candidates[floor_[b]];
  }
  bool changed = false;
  for (size_t b = 0; b < n; ++b) changed = changed || codecs[b] != buckets_[b].codec;
  if (!changed) return;
  ApplyPlan(codecs, why);
  if (replanned) StartTrial();
}

void DataParallel::StartTrial() {
  const AutoCodecOptions& ac = options_.auto_codec;
  trial_ = Trial{};
  if (ac.trial_steps <= 0 || comm_.size() < 2) return;
  if (!ac.link_override.empty() && !ac.trial_under_link_override) return;
  std::vector<dist::CodecKind> plan, narrow;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    plan.push_back(buckets_[b].codec);
    narrow.push_back(auto_bucket_[b] ? ac.candidates[floor_[b]] : buckets_[b].codec);
  }
  if (narrow == plan) return;
  trial_.on = true;
  trial_.plan = std::move(plan);
  trial_.narrow = std::move(narrow);
  if (rank() == 0) {
    LogInfo("codec auto: a trial: this plan and every auto bucket in its narrowest allowed codec (",
            CodecPlanText(trial_.narrow), ") take turns, a step each, ", ac.trial_steps,
            " step(s) each; the faster stays (distributed.auto_trial_steps)");
  }
}

void DataParallel::TrialStep(double step_s) {
  const AutoCodecOptions& ac = options_.auto_codec;
  trial_.step_s.push_back(step_s);
  if (++trial_.steps < 2 * ac.trial_steps) {
    const bool plan_next = trial_.steps % 2 == 0;
    SetCodecs(plan_next ? trial_.plan : trial_.narrow);
    if (trace_ != nullptr) {
      const auto now = Trace::Clock::now();
      trace_->Add(TraceTrack::kGradients,
                  plan_next ? "codec trial: the plan" : "codec trial: the narrowest", "comm", now,
                  now, {{"iteration", static_cast<double>(step_ + 1)}});
    }
    return;
  }
  // Both sides ran: agree on every step's time (the slowest rank's); rank 0 keeps the faster.
  std::vector<double> v = trial_.step_s;
  comm_.AllReduce(v.data(), v.size(), dist::DataType::kF64, dist::ReduceOp::kMax);
  DecideOnRank0([&] { EndTrial(v); });
  ResetSamples();  // the next check measures the plan kept, not the trial
}

void DataParallel::EndTrial(const std::vector<double>& v) {
  std::vector<double> plan_s, narrow_s;
  for (size_t i = 0; i < v.size(); ++i) (i % 2 == 0 ? plan_s : narrow_s).push_back(v[i]);
  const double pace = TrialPace(plan_s, narrow_s);
  const bool narrow = NarrowWinsTrial(pace);
  const Trial done = std::move(trial_);
  trial_ = Trial{};
  ApplyPlan(narrow ? done.narrow : done.plan,
            StrCat("the trial: ", Fixed(TrialStepSeconds(plan_s), 3), " s per step in the plan, ",
                   Fixed(TrialStepSeconds(narrow_s), 3), " s in the narrowest (", Fixed(pace, 3),
                   " of the plan's step, pair by pair), so it keeps ",
                   narrow ? "the narrowest" : "the plan"));
}

CodecPlanInput DataParallel::PlanInput() const {
  return PlanInputFrom(agreed_link_, agreed_backward_end_s_, agreed_ready_s_);
}

CodecPlanInput DataParallel::PlanInputFrom(const LinkModel& link, double backward_end_s,
                                           const std::vector<double>& ready_s) const {
  CodecPlanInput in;
  const double esize = static_cast<double>(DTypeSize(block_.dtype()));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketTiming t;
    // Without overlap every bucket waits for backward's end: nothing hides.
    t.ready_s = options_.overlap ? ready_s[b] : backward_end_s;
    t.f32_bytes = static_cast<double>(buckets_[b].end - buckets_[b].begin) * esize;
    t.fixed = !auto_bucket_[b];
    t.codec = buckets_[b].codec;
    in.buckets.push_back(t);
  }
  in.backward_end_s = backward_end_s;
  in.world_size = options_.auto_codec.plan_world_size > 0 ? options_.auto_codec.plan_world_size
                                                          : std::max(2, comm_.size());
  in.link = link;
  in.candidates = options_.auto_codec.candidates;
  in.hiding_fraction = hiding_fraction_;
  in.merge_f32 = true;  // as CutRuns issues them
  in.merge_sizes =
      BucketSizes{options_.bucket_mb, options_.first_bucket_mb, options_.last_bucket_mb};
  return in;
}

void DataParallel::ApplyPlan(const std::vector<dist::CodecKind>& codecs, const std::string& why) {
  // Floors from the guard hold in every plan.
  const std::vector<dist::CodecKind>& cand = options_.auto_codec.candidates;
  std::vector<dist::CodecKind> next = codecs;
  for (size_t b = 0; b < next.size(); ++b) {
    if (!auto_bucket_[b]) continue;
    const size_t at =
        static_cast<size_t>(std::find(cand.begin(), cand.end(), next[b]) - cand.begin());
    if (at > floor_[b]) next[b] = cand[floor_[b]];
  }
  const CodecPlanInput input = PlanInput();
  const std::vector<PlannedBucket> predicted = ScheduleCodecs(input, next);
  const bool first = auto_plans_ == 0;
  ++auto_plans_;
  std::vector<std::string> lines;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    const dist::CodecKind old = bucket.codec;
    if (!auto_bucket_[b] || (!first && old == next[b])) continue;
    lines.push_back(StrCat(
        "  bucket ", b, " (", bucket.first, " .. ", bucket.last, ", ",
        Bytes(static_cast<double>(bucket.end - bucket.begin) * 4), "): ",
        old == next[b] ? std::string(dist::CodecName(next[b]))
                       : StrCat(dist::CodecName(old), " -> ", dist::CodecName(next[b])),
        ", hiding ", Ms(std::max(0.0, agreed_backward_end_s_ - input.buckets[b].ready_s)),
        ", predicted ", Ms(predicted[b].finish_s - predicted[b].start_s), ", measured ",
        comm_.size() > 1 ? StrCat(Ms(measured_transfer_s_[b]), " (in ", dist::CodecName(old), ")")
                         : std::string("nothing (one rank)")));
  }
  SetCodecs(next);
  if (rank() == 0) {
    LogInfo("codec auto: plan ", auto_plans_, " at iteration ", step_ + 1, ", ", why, ": link ",
            Bytes(agreed_link_.bytes_per_s), "/s + ", Fixed(1e6 * agreed_link_.latency_s, 1),
            " us latency, backward ", Ms(agreed_backward_end_s_), ", counting on ",
            Fixed(hiding_fraction_, 2), " of each hiding time; predicted exposed ",
            Ms(std::max(0.0, (predicted.empty() ? 0.0 : predicted.back().finish_s) -
                                 agreed_backward_end_s_)),
            "; ", runs_.size(), " all-reduces per step; codecs ", codec_plan());
    for (const std::string& line : lines) LogInfo(line);
  }
  TracePlan();
}

void DataParallel::TracePlan() {
  if (trace_ != nullptr) {
    const auto now = Trace::Clock::now();
    Trace::Args args = {{"iteration", static_cast<double>(step_ + 1)},
                        {"bytes_per_s", agreed_link_.bytes_per_s},
                        {"latency_us", 1e6 * agreed_link_.latency_s}};
    for (size_t b = 0; b < buckets_.size(); ++b) {
      args.emplace_back(StrCat("bucket ", b, " bits"), dist::CodecBits(buckets_[b].codec));
    }
    trace_->Add(TraceTrack::kGradients, StrCat("codec plan: ", codec_plan()), "comm", now, now,
                std::move(args));
  }
}

std::string DataParallel::codec_plan() const {
  std::vector<dist::CodecKind> codecs;
  for (const Bucket& b : buckets_) codecs.push_back(b.codec);
  return CodecPlanText(codecs);
}

}  // namespace cortado
