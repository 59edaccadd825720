// What DataParallel keeps and sends of a run's state (data_parallel.h): its checkpoint state (every
// rank's error-feedback residual, codec auto's plan and agreed numbers), and at start-up rank 0's
// starting state sent to every rank (BroadcastState) and the check that every rank runs rank 0's
// job (VerifySameJob).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/parallel/data_parallel.h"

namespace cortado {
namespace {

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string Clip(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

// Bytes travel as f32 elements: broadcast and all-gather copy them without interpreting them.
std::vector<float> PackBytes(const std::string& bytes, size_t floats) {
  std::vector<float> out(floats, 0.0f);
  std::memcpy(out.data(), bytes.data(), std::min(bytes.size(), floats * sizeof(float)));
  return out;
}

}  // namespace

void BroadcastBytes(dist::Communicator& comm, std::string* bytes) {
  double length = static_cast<double>(bytes->size());
  comm.Broadcast(&length, 1, dist::DataType::kF64, 0);
  const size_t n = static_cast<size_t>(length);
  // The bytes travel as f32 elements (broadcast copies them without interpreting them), in the
  // string's own buffer padded to a multiple of four.
  bytes->resize((n + 3) / 4 * 4);
  comm.Broadcast(bytes->data(), bytes->size() / 4, dist::DataType::kF32, 0);
  bytes->resize(n);
}

Checkpoint BroadcastState(dist::Communicator& comm, const std::function<Checkpoint()>& make) {
  std::string blob;
  if (comm.rank() == 0) {
    // Any exception, not only Error (a parser's std::invalid_argument, say): one that escaped
    // would end rank 0 here, and the others would report a lost connection instead of its cause.
    try {
      blob = "S" + SerializeCheckpoint(make());
    } catch (const std::exception& e) {
      blob = std::string("E") + e.what();
    }
  }
  BroadcastBytes(comm, &blob);
  CORTADO_CHECK(!blob.empty(), "rank 0 sent no starting state");
  if (blob[0] == 'E') Fail(blob.substr(1));
  if (comm.rank() == 0) return Checkpoint{};
  return ParseCheckpoint(blob.substr(1), "rank 0's state");
}

void DataParallel::VerifySameJob(const std::string& description) {
  std::string reference = description;
  BroadcastBytes(comm_, &reference);

  // This rank's verdict: empty, or the first line that differs.
  std::string report;
  if (reference != description) {
    std::vector<std::string> a = SplitLines(reference), b = SplitLines(description);
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    auto quoted = [](const std::vector<std::string>& lines, size_t i) {
      return i < lines.size() ? StrCat("'", Clip(lines[i], 120), "'") : std::string("nothing");
    };
    report =
        StrCat("rank ", comm_.rank(), " has ", quoted(b, k), " where rank 0 has ", quoted(a, k));
  }
  // Everyone's verdict to everyone, in fixed-size slots, so every rank throws the same error.
  constexpr size_t kSlotFloats = 96;  // 384 bytes
  std::vector<float> own = PackBytes(report.substr(0, kSlotFloats * 4 - 1), kSlotFloats);
  std::vector<float> all(kSlotFloats * static_cast<size_t>(comm_.size()));
  comm_.AllGather(own.data(), all.data(), kSlotFloats, dist::DataType::kF32);
  std::string ranks, details;
  for (int r = 0; r < comm_.size(); ++r) {
    const char* slot = reinterpret_cast<const char*>(all.data() + r * kSlotFloats);
    std::string text(slot, strnlen(slot, kSlotFloats * 4));
    if (text.empty()) continue;
    if (!ranks.empty()) ranks += ", ";
    ranks += std::to_string(r);
    if (!details.empty()) details += "; ";
    details += text;
  }
  if (!ranks.empty()) {
    Fail("rank(s) ", ranks,
         " do not run the same job as rank 0 (every rank needs the same config, "
         "model and data): ",
         details);
  }
}

void DataParallel::GatherForCheckpoint() {
  if (options_.error_feedback) saved_residuals_ = GatherResiduals();
}

void DataParallel::SaveState(Checkpoint& ckpt) const {
  SaveCodecPlan(ckpt);
  if (saved_residuals_.empty()) return;
  ckpt.meta["error_feedback_ranks"] = std::to_string(saved_residuals_.size());
  for (size_t r = 0; r < saved_residuals_.size(); ++r) {
    ckpt.Add(StrCat("error_feedback/rank", r), saved_residuals_[r]);
  }
}

void DataParallel::LoadState(const Checkpoint& ckpt, const std::string& path) {
  // Every entry is checked before any is taken (LoadCodecPlan checks all of its own first), so
  // a checkpoint that is refused leaves this object as it was.
  const bool has_residuals = ckpt.meta.count("error_feedback_ranks") > 0;
  int64_t ranks = 0;
  std::vector<Tensor> residuals;
  if (has_residuals) {
    ranks = ckpt.MetaInt("error_feedback_ranks", path);
    CORTADO_CHECK(ranks >= 1, "checkpoint '", path, "': error_feedback_ranks is ", ranks,
                  ", not a rank count (1 or more)");
  }
  for (int64_t r = 0; options_.error_feedback && r < ranks; ++r) {
    const std::string name = StrCat("error_feedback/rank", r);
    const Tensor* t = ckpt.Find(name);
    CORTADO_CHECK(t != nullptr, "checkpoint '", path, "' lacks ", name,
                  " (error_feedback_ranks is ", ranks, ")");
    // Every residual has the gradient block's layout: SaveState passes them on as they are.
    CORTADO_CHECK(t->dtype() == DType::kF32 && t->ndim() == 1 && t->numel() == residual_.numel(),
                  "checkpoint '", path, "': ", name, " is ", t->ToString(),
                  ", this model's residual is ", residual_.ToString(),
                  " (the model or its parameters changed)");
    residuals.push_back(*t);
  }
  LoadCodecPlan(ckpt, path);
  saved_residuals_ = std::move(residuals);
  if (!has_residuals) return;
  const bool root = comm_.rank() == 0;
  if (!options_.error_feedback) {
    if (root) LogWarning(ErrorFeedbackDropped(path));
    return;
  }
  if (ranks == comm_.size()) {
    SetResidual(saved_residuals_[static_cast<size_t>(comm_.rank())]);
    return;
  }
  Tensor sum = saved_residuals_[0].Clone();
  for (size_t r = 1; r < saved_residuals_.size(); ++r) {
    const float* add = saved_residuals_[r].data<float>();
    for (int64_t i = 0; i < sum.numel(); ++i) sum.data<float>()[i] += add[i];
  }
  if (!root) sum.Zero();
  SetResidual(sum);
  if (root) {
    LogWarning("checkpoint '", path, "' holds error-feedback residuals of ", ranks,
               " rank(s); this run has ", comm_.size(), ": their sum goes to rank 0 (the run ",
               "continues, but not bitwise as it would on ", ranks, ")");
  }
}

std::string ErrorFeedbackDropped(const std::string& path) {
  return StrCat("checkpoint '", path, "' holds error-feedback residuals, but this run has ",
                "distributed.error_feedback off: they are dropped");
}

void DataParallel::SaveCodecPlan(Checkpoint& ckpt) const {
  if (!options_.auto_codec.enabled || !planned_) return;
  const size_t n = buckets_.size();
  // During a trial: the plan on trial, and a mark that starts the trial over on resume.
  ckpt.meta["codec_auto_plan"] = trial_.on ? CodecPlanText(trial_.plan) : codec_plan();
  if (trial_.on || trial_restart_) ckpt.meta["codec_auto_trial"] = "restart";
  ckpt.meta["codec_auto_plans"] = std::to_string(auto_plans_);
  char fraction[32];  // %.17g: the double back bitwise, so a resumed run plans alike
  std::snprintf(fraction, sizeof(fraction), "%.17g", hiding_fraction_);
  ckpt.meta["codec_auto_hiding_fraction"] = fraction;
  // [latency, rate, backward end, ready per bucket, floor per bucket, measured per bucket]
  Tensor t({static_cast<int64_t>(3 + 3 * n)}, DType::kF64);
  double* v = t.data<double>();
  v[0] = agreed_link_.latency_s;
  v[1] = agreed_link_.bytes_per_s;
  v[2] = agreed_backward_end_s_;
  for (size_t b = 0; b < n; ++b) {
    v[3 + b] = agreed_ready_s_[b];
    v[3 + n + b] = static_cast<double>(floor_[b]);
    v[3 + 2 * n + b] = measured_transfer_s_[b];
  }
  ckpt.Add("codec_auto/measurements", t);
}

void DataParallel::LoadCodecPlan(const Checkpoint& ckpt, const std::string& path) {
  if (!options_.auto_codec.enabled) return;
  auto plan = ckpt.meta.find("codec_auto_plan");
  if (plan == ckpt.meta.end()) return;  // written before the warmup ended: it starts over
  // Everything is checked before anything is taken: a checkpoint that fails leaves the warmup's
  // state as it was. Each error names the file and the entry.
  const size_t n = buckets_.size();
  std::vector<dist::CodecKind> codecs;
  std::istringstream in(plan->second);
  for (std::string name; std::getline(in, name, ',');) {
    try {
      codecs.push_back(dist::ParseCodec(name));
    } catch (const std::exception& e) {
      Fail("checkpoint '", path, "': codec_auto_plan: ", Clip(e.what(), 120));
    }
  }
  const Tensor* t = ckpt.Find("codec_auto/measurements");
  CORTADO_CHECK(t != nullptr, "checkpoint '", path, "' has codec_auto_plan but lacks ",
                "codec_auto/measurements");
  CORTADO_CHECK(codecs.size() == n && t->dtype() == DType::kF64 && t->ndim() == 1 &&
                    t->numel() == static_cast<int64_t>(3 + 3 * n),
                "checkpoint '", path, "': its codec plan has ", codecs.size(),
                " buckets and codec_auto/measurements is ", t->ToString(), "; this run has ", n,
                " buckets, f64[", 3 + 3 * n, "] (the model or distributed.bucket_mb changed)");
  const std::vector<dist::CodecKind>& cand = options_.auto_codec.candidates;
  for (size_t b = 0; b < n; ++b) {
    const bool known = auto_bucket_[b]
                           ? std::find(cand.begin(), cand.end(), codecs[b]) != cand.end()
                           : codecs[b] == buckets_[b].codec;
    CORTADO_CHECK(known, "checkpoint '", path, "': bucket ", b, " travels in ",
                  dist::CodecName(codecs[b]),
                  ", which this run's codec settings do not allow (distributed.codec_candidates "
                  "or the codec keys changed)");
  }
  // [latency, rate, backward end, ready per bucket, floor per bucket, measured per bucket]
  const double* v = t->data<double>();
  const auto check = [&](size_t i, bool ok, const char* what, const char* want) {
    const std::string which = i < 3 ? std::string(what) : StrCat(what, " of bucket ", (i - 3) % n);
    CORTADO_CHECK(ok, "checkpoint '", path, "': codec_auto/measurements: the ", which, " is ", v[i],
                  ", not ", want);
  };
  const auto seconds = [&](size_t i, const char* what) {
    check(i, std::isfinite(v[i]) && v[i] >= 0, what, "a time (finite, 0 or more)");
  };
  seconds(0, "latency");
  check(1, std::isfinite(v[1]) && v[1] > 0, "link rate", "a rate (finite, above 0)");
  seconds(2, "end of backward");
  for (size_t b = 0; b < n; ++b) {
    seconds(3 + b, "ready time");
    const double f = v[3 + n + b];
    // An index into the candidates; one past this run's narrowest (fewer candidates now) is
    // held at its narrowest.
    check(3 + n + b, f >= 0 && f <= 1e9 && f == std::floor(f), "floor",
          "a candidate index (a whole number, 0 or more)");
    seconds(3 + 2 * n + b, "measured transfer");
  }
  int64_t plans = 1;
  if (ckpt.meta.count("codec_auto_plans")) {
    plans = ckpt.MetaInt("codec_auto_plans", path);
    CORTADO_CHECK(plans >= 1, "checkpoint '", path, "': codec_auto_plans is ", plans,
                  ", not a count of plans (1 or more)");
  }
  double fraction = hiding_fraction_;
  auto fraction_entry = ckpt.meta.find("codec_auto_hiding_fraction");
  if (fraction_entry != ckpt.meta.end()) {
    char* end = nullptr;
    fraction = std::strtod(fraction_entry->second.c_str(), &end);
    CORTADO_CHECK(!fraction_entry->second.empty() && *end == '\0' && fraction > 0 && fraction <= 1,
                  "checkpoint '", path, "': codec_auto_hiding_fraction '",
                  Clip(fraction_entry->second, 40), "' is not in (0, 1]");
  }

  agreed_link_ = LinkModel{v[0], v[1]};
  agreed_backward_end_s_ = v[2];
  agreed_ready_s_.assign(v + 3, v + 3 + n);
  for (size_t b = 0; b < n; ++b) {
    floor_[b] = std::min(static_cast<size_t>(v[3 + n + b]), cand.size() - 1);
    measured_transfer_s_[b] = v[3 + 2 * n + b];
    buckets_[b].codec = codecs[b];
  }
  auto_plans_ = plans;
  hiding_fraction_ = fraction;
  CutRuns();
  planned_ = true;
  ResetSamples();
  trial_ = Trial{};
  // Rank 0 starts the trial over at the end of the next step (MeasureStep), which runs in the
  // plan on trial: its first turn.
  trial_restart_ = ckpt.meta.count("codec_auto_trial") > 0;
}

}  // namespace cortado
