#include "engine/codec_plan.h"

#include <algorithm>

#include "engine/error.h"

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
}

}  // namespace

double LinkModel::AllReduceSeconds(double bytes, int world_size) const {
  const double steps = 2.0 * (world_size - 1);
  return steps * latency_s + steps / world_size * bytes / bytes_per_s;
}

namespace {

// Predicted transfers of every bucket in its codec, queued in bucket order.
std::vector<PlannedBucket> Schedule(const CodecPlanInput& in,
                                    const std::vector<dist::CodecKind>& codecs) {
  std::vector<PlannedBucket> plan(in.buckets.size());
  double link_free_at = 0;  // when the previous bucket's transfer finishes
  for (size_t b = 0; b < in.buckets.size(); ++b) {
    PlannedBucket& p = plan[b];
    p.codec = in.buckets[b].fixed ? in.buckets[b].codec : codecs[b];
    p.start_s = std::max(in.buckets[b].ready_s, link_free_at);
    p.finish_s = p.start_s + in.link.AllReduceSeconds(
                                 EncodedBytes(p.codec, in.buckets[b].f32_bytes), in.world_size);
    p.hidden = p.finish_s <= in.backward_end_s;
    link_free_at = p.finish_s;
  }
  return plan;
}

double End(const std::vector<PlannedBucket>& plan) {
  return plan.empty() ? 0.0 : plan.back().finish_s;
}

}  // namespace

std::vector<PlannedBucket> PlanCodecs(const CodecPlanInput& in) {
  CheckInput(in);
  std::vector<dist::CodecKind> codecs(in.buckets.size(), in.candidates.back());
  // A tiny slack so that rounding in the sums never rejects a choice that ties the limit.
  const double limit = std::max(End(Schedule(in, codecs)), in.backward_end_s) * (1 + 1e-12);
  for (size_t b = 0; b < codecs.size(); ++b) {
    if (in.buckets[b].fixed) continue;
    for (dist::CodecKind codec : in.candidates) {  // widest first; the narrowest always fits
      codecs[b] = codec;
      if (End(Schedule(in, codecs)) <= limit) break;
    }
  }
  return Schedule(in, codecs);
}

std::vector<PlannedBucket> ScheduleCodecs(const CodecPlanInput& in,
                                          const std::vector<dist::CodecKind>& codecs) {
  CheckInput(in);
  CORTADO_CHECK(codecs.size() == in.buckets.size(), "codec plan: ", in.buckets.size(),
                " buckets but ", codecs.size(), " codecs");
  return Schedule(in, codecs);
}

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

}  // namespace cortado
