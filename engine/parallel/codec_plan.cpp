#include "engine/parallel/codec_plan.h"

#include <algorithm>
#include <utility>

#include "engine/base/error.h"

namespace cortado {
namespace {

double EncodedBytes(dist::CodecKind codec, double f32_bytes) {
  return f32_bytes * dist::CodecBits(codec) / 32.0;
}

void CheckInput(const CodecPlanInput& in) {
  CORTADO_CHECK(!in.candidates.empty(), "codec plan: no candidate codecs");
  for (size_t i = 1; i < in.candidates.size(); ++i) {
    CORTADO_CHECK(dist::CodecBits(in.candidates[i - 1]) > dist::CodecBits(in.candidates[i]),
                  "codec plan: candidates must go from widest to narrowest, but ",
                  dist::CodecName(in.candidates[i - 1]), " comes before ",
                  dist::CodecName(in.candidates[i]));
  }
  CORTADO_CHECK(in.link.bytes_per_s > 0 && in.link.latency_s >= 0,
                "codec plan: the link's rate must be positive (", in.link.bytes_per_s,
                " B/s) and its latency not negative (", in.link.latency_s, " s)");
  CORTADO_CHECK(in.world_size >= 2, "codec plan: needs 2 or more ranks, got ", in.world_size);
  CORTADO_CHECK(in.hiding_fraction > 0 && in.hiding_fraction <= 1,
                "codec plan: the hiding fraction must be in (0, 1], got ", in.hiding_fraction);
}

}  // namespace

double LinkModel::AllReduceSeconds(double bytes, int world_size) const {
  const double steps = 2.0 * (world_size - 1);
  return steps * latency_s + steps / world_size * bytes / bytes_per_s;
}

namespace {

// Seconds per byte by least squares over the samples `keep` marks; where that is not positive
// (one size only, noise), their mean.
double SecondsPerByte(const std::vector<double>& u, const std::vector<double>& y,
                      const std::vector<bool>& keep) {
  double k = 0, su = 0, sy = 0, suu = 0, suy = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (!keep[i]) continue;
    k += 1;
    su += u[i];
    sy += y[i];
    suu += u[i] * u[i];
    suy += u[i] * y[i];
  }
  const double var = suu - su * su / k;
  const double spb = var > 0 ? (suy - su * sy / k) / var : 0;
  return spb > 0 ? spb : (su > 0 ? sy / su : 0);
}

}  // namespace

LinkModel FitLink(const std::vector<double>& u, const std::vector<double>& y, int world_size) {
  CORTADO_CHECK(u.size() == y.size() && world_size >= 2, "FitLink: ", u.size(), " sizes, ",
                y.size(), " times, ", world_size, " ranks");
  if (u.empty()) return LinkModel{};
  std::vector<bool> keep(u.size(), true);
  double spb = SecondsPerByte(u, y, keep);
  // Delays only add time: fit again on the samples at or below the median residual.
  std::vector<double> residual(u.size());
  for (size_t i = 0; i < u.size(); ++i) residual[i] = y[i] - spb * u[i];
  std::vector<double> sorted = residual;
  std::nth_element(sorted.begin(), sorted.begin() + (sorted.size() - 1) / 2, sorted.end());
  const double median = sorted[(sorted.size() - 1) / 2];
  for (size_t i = 0; i < u.size(); ++i) keep[i] = residual[i] <= median;
  spb = SecondsPerByte(u, y, keep);
  if (!(spb > 0)) return LinkModel{};
  double fixed = y[0] - spb * u[0];
  for (size_t i = 1; i < u.size(); ++i) fixed = std::min(fixed, y[i] - spb * u[i]);
  return LinkModel{std::max(0.0, fixed) / (2.0 * (world_size - 1)), 1.0 / spb};
}

namespace {

// Predicted transfers of every bucket in its codec, queued in bucket order (in runs with
// merge_f32); each ready time counts `fraction` of its hiding time.
std::vector<PlannedBucket> Schedule(const CodecPlanInput& in,
                                    const std::vector<dist::CodecKind>& codecs, double fraction) {
  const size_t n = in.buckets.size();
  std::vector<PlannedBucket> plan(n);
  std::vector<double> bytes(n);
  std::vector<bool> f32(n);
  for (size_t b = 0; b < n; ++b) {
    plan[b].codec = in.buckets[b].fixed ? in.buckets[b].codec : codecs[b];
    bytes[b] = EncodedBytes(plan[b].codec, in.buckets[b].f32_bytes);
    f32[b] = plan[b].codec == dist::CodecKind::kF32;
  }
  std::vector<IssueRun> runs;
  if (in.merge_f32) {
    runs = MergeRuns(bytes, f32, in.merge_sizes);
  } else {
    for (size_t b = 0; b < n; ++b) runs.push_back({b, b + 1});
  }
  double link_free_at = 0;  // when the previous run's transfer finishes
  for (const IssueRun& run : runs) {
    double ready = 0, run_bytes = 0;
    for (size_t b = run.begin; b < run.end; ++b) {
      const double hiding = std::max(0.0, in.backward_end_s - in.buckets[b].ready_s);
      ready = std::max(ready, in.buckets[b].ready_s + (1 - fraction) * hiding);
      run_bytes += bytes[b];
    }
    const double start = std::max(ready, link_free_at);
    const double finish = start + in.link.AllReduceSeconds(run_bytes, in.world_size);
    for (size_t b = run.begin; b < run.end; ++b) {
      plan[b].start_s = start;
      plan[b].finish_s = finish;
      plan[b].hidden = finish <= in.backward_end_s;
    }
    link_free_at = finish;
  }
  return plan;
}

double End(const std::vector<PlannedBucket>& plan) {
  return plan.empty() ? 0.0 : plan.back().finish_s;
}

}  // namespace

std::vector<PlannedBucket> PlanCodecs(const CodecPlanInput& in) {
  CheckInput(in);
  const double f = in.hiding_fraction;
  const dist::CodecKind widest = in.candidates.front(), narrowest = in.candidates.back();
  // When communication ends if every chosen bucket from `from` on travels in `rest`.
  const auto end_with = [&](std::vector<dist::CodecKind> codecs, size_t from,
                            dist::CodecKind rest) {
    for (size_t k = from; k < codecs.size(); ++k) codecs[k] = rest;
    return End(Schedule(in, codecs, f));
  };
  // Where all-reduces carry a latency and f32 buckets join, the widest everywhere can end
  // sooner than the narrowest: the reference is the sooner of the two.
  std::vector<dist::CodecKind> codecs(in.buckets.size(), narrowest);
  const double soonest = std::min(end_with(codecs, 0, narrowest), end_with(codecs, 0, widest));
  // A tiny slack so that rounding in the sums never rejects a choice that ties the limit.
  const double limit = std::max(soonest, in.backward_end_s) * (1 + 1e-12);
  for (size_t b = 0; b < codecs.size(); ++b) {
    if (in.buckets[b].fixed) continue;
    // Widest first. One candidate always fits: the previous choice fitted with every later
    // bucket in the narrowest or in the widest, and this bucket can take either.
    for (dist::CodecKind codec : in.candidates) {
      codecs[b] = codec;
      if (std::min(end_with(codecs, b + 1, narrowest), end_with(codecs, b + 1, widest)) <= limit) {
        break;
      }
    }
  }
  return Schedule(in, codecs, 1.0);
}

std::vector<PlannedBucket> ScheduleCodecs(const CodecPlanInput& in,
                                          const std::vector<dist::CodecKind>& codecs) {
  CheckInput(in);
  CORTADO_CHECK(codecs.size() == in.buckets.size(), "codec plan: ", in.buckets.size(),
                " buckets but ", codecs.size(), " codecs");
  return Schedule(in, codecs, 1.0);
}

double NextHidingFraction(double fraction, double exposed_s, double predicted_s,
                          double backward_end_s) {
  if (exposed_s - predicted_s <= 0.05 * backward_end_s + 1e-3) return fraction;
  return std::max(0.05, 0.75 * fraction);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double TrialStepSeconds(const std::vector<double>& step_s) {
  return Median(std::vector<double>(step_s.begin() + (step_s.size() >= 2 ? 1 : 0), step_s.end()));
}

double TrialPace(const std::vector<double>& plan_step_s, const std::vector<double>& narrow_step_s) {
  const size_t pairs = std::min(plan_step_s.size(), narrow_step_s.size());
  std::vector<double> pace;
  for (size_t i = pairs >= 2 ? 1 : 0; i < pairs; ++i) {
    if (plan_step_s[i] > 0) pace.push_back(narrow_step_s[i] / plan_step_s[i]);
  }
  return pace.empty() ? 1 : Median(std::move(pace));
}

bool NarrowWinsTrial(double pace) { return pace < 1; }

std::vector<dist::CodecKind> Widen(const std::vector<dist::CodecKind>& codecs,
                                   const std::vector<double>& residual_ratios, double max_ratio,
                                   const std::vector<dist::CodecKind>& candidates) {
  CORTADO_CHECK(codecs.size() == residual_ratios.size(), "codec guard: ", codecs.size(),
                " buckets but ", residual_ratios.size(), " residual ratios");
  std::vector<dist::CodecKind> widened = codecs;
  for (size_t b = 0; b < codecs.size(); ++b) {
    if (!(residual_ratios[b] > max_ratio)) continue;
    auto at = std::find(candidates.begin(), candidates.end(), codecs[b]);
    CORTADO_CHECK(at != candidates.end(), "codec guard: bucket ", b, " travels in ",
                  dist::CodecName(codecs[b]), ", which is not a candidate");
    if (at != candidates.begin()) widened[b] = *(at - 1);
  }
  return widened;
}

std::string CodecPlanText(const std::vector<dist::CodecKind>& codecs) {
  std::string out;
  for (dist::CodecKind c : codecs) out += StrCat(out.empty() ? "" : ",", dist::CodecName(c));
  return out;
}

}  // namespace cortado
