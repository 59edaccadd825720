// distributed.codec: auto in DataParallel (data_parallel.h, "Auto codecs"), its measurement and
// agreement: each step's timing samples (MeasureStep, which also calls the checks and the trial
// when due), the numbers the ranks agree on (AgreedMeasurement, a max all-reduce), the fixed link
// rates of CORTADO_AUTO_LINK, and DecideOnRank0, which runs rank 0's decision
// (data_parallel_auto_decide.cpp) and sends its outcome to every rank.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "engine/base/error.h"
#include "engine/parallel/data_parallel.h"

namespace cortado {

std::vector<std::pair<int64_t, double>> AutoLinkFromEnv() {
  const char* env = std::getenv("CORTADO_AUTO_LINK");
  std::vector<std::pair<int64_t, double>> out;
  if (env == nullptr || *env == '\0') return out;
  std::istringstream in(env);
  for (std::string item; std::getline(in, item, ',');) {
    int64_t from = 0;
    std::string rate = item;
    const size_t colon = item.find(':');
    if (colon != std::string::npos) {
      char* end = nullptr;
      from = std::strtoll(item.c_str(), &end, 10);
      CORTADO_CHECK(end == item.c_str() + colon && from >= 0, "CORTADO_AUTO_LINK: '", item,
                    "' is not ITERATION:RATE");
      rate = item.substr(colon + 1);
    }
    char* end = nullptr;
    const double r = std::strtod(rate.c_str(), &end);
    CORTADO_CHECK(!rate.empty() && *end == '\0' && std::isfinite(r) && r > 0,
                  "CORTADO_AUTO_LINK: '", item,
                  "' is not a positive rate in bytes/s (e.g. 1.25e7 or 40:1.25e9)");
    CORTADO_CHECK(out.empty() || from > out.back().first, "CORTADO_AUTO_LINK: iteration ", from,
                  " does not follow ", out.empty() ? 0 : out.back().first);
    CORTADO_CHECK(!out.empty() || colon == std::string::npos, "CORTADO_AUTO_LINK: '", env,
                  "' must start with a rate without an iteration (the rate from the start)");
    out.emplace_back(from, r);
  }
  return out;
}

void DataParallel::MeasureStep(Trace::Clock::time_point backward_end,
                               Trace::Clock::time_point step_end) {
  const AutoCodecOptions& ac = options_.auto_codec;
  const auto since_start = [&](Trace::Clock::time_point t) {
    return std::chrono::duration<double>(t - step_start_).count();
  };
  if (trial_restart_) {
    // Resumed from a checkpoint taken during a trial: the step just run was in the plan on
    // trial, the trial's first turn, if rank 0 starts one.
    trial_restart_ = false;
    DecideOnRank0([&] { StartTrial(); });
  }
  if (trial_.on) {
    TrialStep(since_start(step_end));
    return;
  }
  ++samples_.steps;
  // The first warmup step (allocation, connection set-up) is left out when there are more.
  const bool skip = !planned_ && ac.warmup_steps >= 2 && samples_.steps == 1;
  if (!skip) {
    const double esize = static_cast<double>(DTypeSize(block_.dtype()));
    const double ring = 2.0 * (comm_.size() - 1) / comm_.size();
    double ready = 0;
    std::vector<double> run_seconds(buckets_.size(), 0.0);
    for (size_t r = 0; r < runs_.size(); ++r) {
      const dist::Work& w = *work_[r];
      const double seconds =
          std::chrono::duration<double>(w.finished_at() - w.started_at()).count();
      double bytes = 0;
      for (size_t b = runs_[r].begin; b < runs_[r].end; ++b) {
        run_seconds[b] = seconds;
        const size_t count = static_cast<size_t>(buckets_[b].end - buckets_[b].begin);
        bytes += buckets_[b].codec == dist::CodecKind::kF32
                     ? static_cast<double>(count) * esize
                     : static_cast<double>(dist::EncodedBytes(buckets_[b].codec, count));
      }
      if (bytes > 0) {
        samples_.ring_bytes.push_back(ring * bytes);
        samples_.seconds.push_back(seconds);
      }
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      // A bucket without parameters (the control words) is ready with the one before it; one
      // that the hook did not complete, when backward returned.
      if (buckets_[b].params == 0) {
        // keeps `ready` of the bucket before
      } else if (ready_seen_[b]) {
        ready = since_start(ready_at_[b]);
      } else {
        ready = since_start(backward_end);
      }
      samples_.ready_s[b].push_back(ready);
      samples_.transfer_s[b].push_back(run_seconds[b]);
    }
    samples_.backward_end_s.push_back(since_start(backward_end));
    samples_.wait_s.push_back(last_wait_s_);
  }
  if (!planned_) {
    if (samples_.steps < ac.warmup_steps) return;
    std::vector<double> m = AgreedMeasurement();
    DecideOnRank0([&] { FirstPlan(m); });
    return;
  }
  if (ac.interval > 0 && (step_ + 1) % ac.interval == 0) {
    std::vector<double> m = AgreedMeasurement();
    DecideOnRank0([&] { AutoCheck(m); });
  }
}

void DataParallel::DecideOnRank0(const std::function<void()>& decide) {
  // "S" and the state, or "E" and rank 0's error, so that every rank throws it.
  std::string message;
  if (rank() == 0) {
    try {
      decide();
      const std::vector<double> state = AutoState();
      message = "S" + std::string(reinterpret_cast<const char*>(state.data()),
                                  state.size() * sizeof(double));
    } catch (const std::exception& e) {
      message = std::string("E") + e.what();
    }
  }
  if (comm_.size() > 1) BroadcastBytes(comm_, &message);
  CORTADO_CHECK(!message.empty(), "codec auto: rank 0 sent no decision");
  if (message[0] == 'E') Fail(message.substr(1));
  if (rank() == 0) return;
  std::vector<double> state((message.size() - 1) / sizeof(double));
  CORTADO_CHECK(state.size() == 7 + 5 * buckets_.size() &&
                    message.size() == 1 + state.size() * sizeof(double),
                "codec auto: rank 0's decision has ", message.size() - 1, " bytes, this rank has ",
                buckets_.size(), " buckets");
  std::memcpy(state.data(), message.data() + 1, state.size() * sizeof(double));
  AdoptAutoState(state);
}

std::vector<double> DataParallel::AutoState() const {
  const size_t n = buckets_.size();
  // [planned, plans, hiding fraction, latency, rate, backward end, trial on,
  //  per bucket: codec, the trial's narrowest, floor, ready time, measured transfer]
  std::vector<double> v = {planned_ ? 1.0 : 0.0,     static_cast<double>(auto_plans_),
                           hiding_fraction_,         agreed_link_.latency_s,
                           agreed_link_.bytes_per_s, agreed_backward_end_s_,
                           trial_.on ? 1.0 : 0.0};
  for (size_t b = 0; b < n; ++b) {
    v.push_back(static_cast<double>(buckets_[b].codec));
    v.push_back(static_cast<double>(trial_.on ? trial_.narrow[b] : buckets_[b].codec));
    v.push_back(static_cast<double>(floor_[b]));
    v.push_back(agreed_ready_s_[b]);
    v.push_back(measured_transfer_s_[b]);
  }
  return v;
}

void DataParallel::AdoptAutoState(const std::vector<double>& v) {
  const size_t n = buckets_.size();
  const int64_t plans_before = auto_plans_;
  planned_ = v[0] != 0;
  auto_plans_ = static_cast<int64_t>(v[1]);
  hiding_fraction_ = v[2];
  agreed_link_ = LinkModel{v[3], v[4]};
  agreed_backward_end_s_ = v[5];
  std::vector<dist::CodecKind> codecs(n), narrow(n);
  for (size_t b = 0; b < n; ++b) {
    const double* u = v.data() + 7 + 5 * b;
    codecs[b] = static_cast<dist::CodecKind>(static_cast<int>(u[0]));
    narrow[b] = static_cast<dist::CodecKind>(static_cast<int>(u[1]));
    floor_[b] = static_cast<size_t>(u[2]);
    agreed_ready_s_[b] = u[3];
    measured_transfer_s_[b] = u[4];
  }
  SetCodecs(codecs);
  trial_ = Trial{};
  if (v[6] != 0) {
    trial_.on = true;
    trial_.plan = codecs;
    trial_.narrow = std::move(narrow);
  }
  if (auto_plans_ != plans_before) TracePlan();
}

void DataParallel::ApplyLinkOverride(std::vector<double>& m) const {
  // Fixed rates replace the measured link (CORTADO_AUTO_LINK, tests): rank 0's.
  const size_t n = buckets_.size();
  const auto& over = options_.auto_codec.link_override;
  for (size_t i = over.size(); i-- > 0;) {
    if (i == 0 || over[i].first <= step_) {
      m[0] = 0;
      m[1] = 1.0 / over[i].second;
      m[3 + 3 * n] = -1;  // the measured exposure is not the fixed rate's: no exposure check
      break;
    }
  }
}

std::vector<double> DataParallel::AgreedMeasurement() {
  const size_t n = buckets_.size();
  // [latency, seconds per byte, backward end, ready per bucket, residual ratio per bucket,
  //  transfer per bucket, exposed communication]
  std::vector<double> v(4 + 3 * n, 0.0);
  const std::vector<double>& u = samples_.ring_bytes;
  const std::vector<double>& y = samples_.seconds;
  if (!u.empty() && comm_.size() > 1) {
    const LinkModel link = FitLink(u, y, comm_.size());
    v[0] = link.latency_s;
    v[1] = link.bytes_per_s > 0 ? 1.0 / link.bytes_per_s : 0.0;
  }
  v[2] = Median(samples_.backward_end_s);
  v[3 + 3 * n] = Median(samples_.wait_s);
  for (size_t b = 0; b < n; ++b) {
    v[3 + b] = Median(samples_.ready_s[b]);
    v[3 + 2 * n + b] = Median(samples_.transfer_s[b]);
    if (!auto_bucket_[b] || !UsesFeedback(buckets_[b].codec)) continue;
    // The guard: this rank's residual against the reduced gradient of the step just done.
    const float* r = residual_.data<float>();
    const float* g = staging_.data<float>();
    double rr = 0, gg = 0;
    for (int64_t i = buckets_[b].begin; i < buckets_[b].end; ++i) {
      rr += static_cast<double>(r[i]) * r[i];
      gg += static_cast<double>(g[i]) * g[i];
    }
    v[3 + n + b] = gg > 0 ? std::sqrt(rr / gg) : (rr > 0 ? INFINITY : 0.0);
  }
  comm_.AllReduce(v.data(), v.size(), dist::DataType::kF64, dist::ReduceOp::kMax);
  ResetSamples();
  return v;
}

void DataParallel::ResetSamples() {
  samples_ = Samples{};
  samples_.ready_s.assign(buckets_.size(), {});
  samples_.transfer_s.assign(buckets_.size(), {});
}

void DataParallel::AdoptMeasurement(const std::vector<double>& m) {
  const size_t n = buckets_.size();
  agreed_link_ = LinkModel{m[0], m[1] > 0 ? 1.0 / m[1] : 0.0};
  agreed_backward_end_s_ = m[2];
  agreed_ready_s_.assign(m.begin() + 3, m.begin() + 3 + static_cast<int64_t>(n));
}

}  // namespace cortado
