#include "engine/parallel/data_parallel.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/base/thread_pool.h"

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

void ApplyCodecPolicy(Net& net, const CodecPolicy& policy) {
  // auto: the plan chooses (DataParallel with auto_codec.enabled); until then f32.
  const bool auto_codec = policy.codec == "auto";
  const dist::CodecKind fallback =
      auto_codec ? dist::CodecKind::kF32 : dist::ParseCodec(policy.codec);
  std::vector<bool> used(policy.overrides.size(), false);
  for (const auto& [pattern, codec] : policy.overrides) {
    try {
      dist::ParseCodec(codec);
    } catch (const std::exception& e) {
      Fail("codec override '", pattern, "': ", e.what());
    }
  }
  for (Param* p : net.params()) {
    dist::CodecKind codec = fallback;
    bool chosen_by_plan = auto_codec;
    if (std::find(policy.keep_f32.begin(), policy.keep_f32.end(), p->kind) !=
        policy.keep_f32.end()) {
      codec = dist::CodecKind::kF32;
      chosen_by_plan = false;
    }
    bool matched = false;
    for (size_t i = 0; i < policy.overrides.size(); ++i) {
      if (fnmatch(policy.overrides[i].first.c_str(), p->name.c_str(), 0) != 0) continue;
      used[i] = true;
      if (!matched) codec = dist::ParseCodec(policy.overrides[i].second);
      matched = true;
      chosen_by_plan = false;
    }
    p->codec = chosen_by_plan ? std::string("auto") : std::string(dist::CodecName(codec));
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      std::string some;
      for (Param* p : net.params()) {
        if (some.size() > 60) break;
        some += (some.empty() ? "" : ", ") + p->name;
      }
      Fail("codec override '", policy.overrides[i].first,
           "' matches no parameter (names look like: ", some, ", ...)");
    }
  }
}

dist::CodecKind CodecOfParam(const Param& param) {
  if (param.codec.empty()) return dist::CodecKind::kF32;
  CORTADO_CHECK(param.codec != "auto", "parameter '", param.name,
                "' has codec auto, but the data-parallel run does not plan codecs");
  try {
    return dist::ParseCodec(param.codec);
  } catch (const std::exception& e) {
    Fail("parameter '", param.name, "': ", e.what());
  }
}

dist::DataType WireTypeOf(DType dtype, const std::string& what) {
  // By name, not by number: the two enums number f16 differently (DType::kF16 is 2,
  // dist::DataType::kF16 is 1), so a cast would silently send f16 as bf16.
  switch (dtype) {
    case DType::kF32:
      return dist::DataType::kF32;
    case DType::kF64:
      return dist::DataType::kF64;
    case DType::kF16:
      return dist::DataType::kF16;
    case DType::kBF16:
      return dist::DataType::kBF16;
    case DType::kI32:
    case DType::kU8:
      break;
  }
  Fail(what, ": the collectives reduce f32, f64, f16 and bf16 tensors, not ", DTypeName(dtype));
}

DataParallel::DataParallel(Net& net, dist::Communicator& comm, DataParallelOptions options)
    : net_(net), comm_(comm), options_(options) {
  // Parameters in the order backward finishes them: layers in reverse.
  std::vector<Param*> order;
  for (auto it = net_.layers().rbegin(); it != net_.layers().rend(); ++it) {
    for (Param& p : (*it)->params()) order.push_back(&p);
  }
  CORTADO_CHECK(!order.empty(), "the net has no parameters to train");  // before order.front()
  const DType dtype = order.front()->grad.dtype();
  for (Param* p : order) {
    CORTADO_CHECK(p->grad.dtype() == dtype, "parameter '", p->name, "' is ",
                  DTypeName(p->grad.dtype()), " but '", order.front()->name, "' is ",
                  DTypeName(dtype), "; data-parallel gradients need one dtype");
  }
  CORTADO_CHECK(dtype == DType::kF32 || dtype == DType::kF64, "gradient of '", order.front()->name,
                "': data-parallel training supports f32 and f64 gradients, got ", DTypeName(dtype));
  wire_type_ = WireTypeOf(dtype, "gradient of '" + order.front()->name + "'");
  const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));
  const AutoCodecOptions& ac = options_.auto_codec;
  if (ac.enabled) {
    CORTADO_CHECK(!ac.candidates.empty(), "distributed.codec_candidates: no codec to choose from");
    CORTADO_CHECK(ac.warmup_steps >= 1, "distributed.auto_warmup_steps must be >= 1, got ",
                  ac.warmup_steps);
  }
  std::vector<BucketedParam> planned(order.size());
  std::vector<bool> is_auto(order.size(), false);
  for (size_t i = 0; i < order.size(); ++i) {
    is_auto[i] = order[i]->codec == "auto";
    CORTADO_CHECK(!is_auto[i] || ac.enabled, "parameter '", order[i]->name,
                  "' has codec auto, but the data-parallel run does not plan codecs");
    // An auto parameter is cut into buckets as the narrowest candidate would be: apart from
    // the parameters kept in f32, so that a bucket's codec can change.
    planned[i] = BucketedParam{order[i]->name, order[i]->grad.numel(),
                               is_auto[i] ? ac.candidates.back() : CodecOfParam(*order[i])};
    if (planned[i].codec != dist::CodecKind::kF32) {
      CORTADO_CHECK(dtype == DType::kF32, "parameter '", order[i]->name, "' has gradient codec ",
                    order[i]->codec, ", but gradients are ", DTypeName(dtype),
                    "; the codecs compress f32 gradients (use distributed.codec: f32 here)");
    }
  }
  BucketPlan plan = PlanBuckets(
      planned, BucketSizes{options_.bucket_mb, options_.first_bucket_mb, options_.last_bucket_mb},
      esize);
  buckets_ = std::move(plan.buckets);
  control_index_ = plan.control_index;
  for (size_t i = 0; i < order.size(); ++i) bucket_of_[order[i]] = plan.bucket_of[i];
  const std::vector<int64_t>& offset = plan.offset;
  auto_bucket_.assign(buckets_.size(), false);
  for (size_t i = 0; i < order.size(); ++i) {
    if (is_auto[i]) auto_bucket_[plan.bucket_of[i]] = true;
  }
  if (ac.enabled) {
    // The warmup measures in the widest candidate.
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (auto_bucket_[b]) buckets_[b].codec = ac.candidates.front();
    }
    floor_.assign(buckets_.size(), ac.candidates.size() - 1);
    CORTADO_CHECK(ac.hiding_fraction > 0 && ac.hiding_fraction <= 1,
                  "distributed.auto_hiding_fraction must be in (0, 1], got ", ac.hiding_fraction);
    hiding_fraction_ = ac.hiding_fraction;
    ResetSamples();
    measured_transfer_s_.assign(buckets_.size(), 0.0);
    agreed_ready_s_.assign(buckets_.size(), 0.0);
  }
  // Error feedback: everywhere with distributed.error_feedback; under auto for the sub-16-bit
  // candidates. The residual block exists in either case (options().error_feedback says so).
  feedback_all_ = options_.error_feedback;
  if (ac.enabled) {
    for (dist::CodecKind c : ac.candidates) {
      if (dist::CodecBits(c) < 16) options_.error_feedback = true;
    }
  }

  // The block is the communicator's registered memory: registered once, here, and on one host
  // over UCX mapped by the other ranks, whose all-reduces then read and write it directly.
  block_ = Tensor({plan.block_elements}, dtype, allocator_);
  block_.Zero();
  if (options_.error_feedback) {
    residual_ = Tensor({plan.block_elements}, DType::kF32);
    residual_.Zero();
    if (options_.discardable_steps) residual_kept_ = residual_.Clone();
  }
  for (size_t i = 0; i < order.size(); ++i) {
    order[i]->grad = block_.View(order[i]->grad.shape(), offset[i]);
  }
  pending_.assign(buckets_.size(), 0);
  CutRuns();
  ready_at_.resize(buckets_.size());
  ready_seen_.assign(buckets_.size(), false);
  net_.set_grad_ready_hook(
      [this](Layer&, std::vector<Param>& params) { OnGradientsReady(params); });
}

DataParallel::~DataParallel() {
  net_.set_grad_ready_hook(nullptr);
  WaitAll(false);
  // The gradients (views into the block) may outlive this object, the communicator not.
  allocator_->Detach();
}

void DataParallel::WaitAll(bool rethrow) {
  for (auto& w : work_) {
    if (!w) continue;
    if (rethrow) {
      w->Wait();
    } else {
      try {
        w->Wait();
      } catch (...) {
      }
    }
  }
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

void DataParallel::BeginStep(int64_t step) {
  step_ = step;
  WaitAll(true);  // nothing may still write the block (a step that failed halfway)
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].params;
  for (auto& w : work_) w.reset();
  next_run_ = 0;
  step_start_ = Trace::Clock::now();
  std::fill(ready_seen_.begin(), ready_seen_.end(), false);
  SetControlWord(0, 0.0);
  SetControlWord(1, 0.0);
  // Kept for DiscardStep: the residual changes as each compressed bucket is encoded.
  if (!residual_kept_.empty()) CopyCompressedRanges(residual_, residual_kept_);
}

bool DataParallel::UsesFeedback(dist::CodecKind codec) const {
  if (codec == dist::CodecKind::kF32 || residual_.empty()) return false;
  return feedback_all_ || (options_.auto_codec.enabled && dist::CodecBits(codec) < 16);
}

void DataParallel::CopyCompressedRanges(const Tensor& from, Tensor& to) const {
  const float* src = from.data<float>();
  float* dst = to.data<float>();
  for (const Bucket& b : buckets_) {
    if (!UsesFeedback(b.codec)) continue;  // f32 buckets never touch the residual
    std::memcpy(dst + b.begin, src + b.begin, static_cast<size_t>(b.end - b.begin) * 4);
  }
}

void DataParallel::DiscardStep() {
  CORTADO_CHECK(options_.discardable_steps,
                "DiscardStep without DataParallelOptions::discardable_steps (the residual of "
                "BeginStep was not kept)");
  WaitAll(true);
  if (!residual_kept_.empty()) CopyCompressedRanges(residual_kept_, residual_);
}

void DataParallel::SetControl(double loss, bool stop_vote) {
  CORTADO_CHECK(next_run_ < runs_.size(), "SetControl after the last gradient bucket was issued");
  SetControlWord(0, stop_vote ? 1.0 : 0.0);
  SetControlWord(1, loss);
}

void DataParallel::SetControlWord(int i, double value) {
  DispatchFloat(block_.dtype(), "gradient block", [&](auto zero) {
    using T = decltype(zero);
    block_.data<T>()[control_index_ + i] = static_cast<T>(value);
  });
}

double DataParallel::ControlWord(int i) const {
  return ElementAsDouble(block_, control_index_ + i);
}

void DataParallel::OnGradientsReady(std::vector<Param>& params) {
  for (Param& p : params) {
    auto it = bucket_of_.find(&p);
    CORTADO_ASSERT(it != bucket_of_.end());
    if (--pending_[it->second] == 0) {
      ready_at_[it->second] = Trace::Clock::now();
      ready_seen_[it->second] = true;
    }
  }
  if (options_.overlap) IssueReadyRuns();
}

void DataParallel::CutRuns() {
  runs_.clear();
  if (options_.auto_codec.enabled) {
    std::vector<double> bytes;
    std::vector<bool> f32;
    for (const Bucket& b : buckets_) {
      bytes.push_back(static_cast<double>(b.end - b.begin) * DTypeSize(block_.dtype()));
      f32.push_back(b.codec == dist::CodecKind::kF32);
    }
    runs_ = MergeRuns(
        bytes, f32,
        BucketSizes{options_.bucket_mb, options_.first_bucket_mb, options_.last_bucket_mb});
  } else {
    for (size_t b = 0; b < buckets_.size(); ++b) runs_.push_back({b, b + 1});
  }
  work_.assign(runs_.size(), nullptr);
  queued_at_.resize(runs_.size());
}

void DataParallel::IssueReadyRuns() {
  while (next_run_ < runs_.size()) {
    const IssueRun& run = runs_[next_run_];
    for (size_t b = run.begin; b < run.end; ++b) {
      if (pending_[b] != 0) return;
    }
    Issue(next_run_++);
  }
}

void DataParallel::Issue(size_t r) {
  // A run of several buckets is f32 (MergeRuns joins only those): one all-reduce over their
  // joined range. A compressed bucket runs alone, and its stream is seeded by its index.
  const size_t b = runs_[r].begin;
  const Bucket& bucket = buckets_[b];
  const size_t esize = DTypeSize(block_.dtype());
  char* base = static_cast<char*>(block_.raw_data()) + static_cast<size_t>(bucket.begin) * esize;
  const size_t count = static_cast<size_t>(buckets_[runs_[r].end - 1].end - bucket.begin);
  queued_at_[r] = Trace::Clock::now();
  if (bucket.codec == dist::CodecKind::kF32) {
    work_[r] = comm_.AllReduceAsync(base, count, wire_type_, dist::ReduceOp::kAvg);
    return;
  }
  CORTADO_ASSERT(runs_[r].end == b + 1);
  dist::Compression compression;
  compression.codec = bucket.codec;
  compression.rounding = options_.rounding;
  // A stream per (run, step, bucket): splitmix64 steps of the three.
  uint64_t h = options_.seed + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(step_) + 1);
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull + b;
  compression.seed = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  if (UsesFeedback(bucket.codec)) compression.residual = residual_.data<float>() + bucket.begin;
  work_[r] = comm_.AllReduceCompressedAsync(reinterpret_cast<float*>(base), count,
                                            dist::ReduceOp::kAvg, compression);
}

double DataParallel::wire_bytes_per_step() const {
  const double ring = 2.0 * (comm_.size() - 1) / comm_.size();
  double bytes = 0;
  for (const Bucket& bucket : buckets_) {
    const size_t count = static_cast<size_t>(bucket.end - bucket.begin);
    bytes += bucket.codec == dist::CodecKind::kF32
                 ? static_cast<double>(count * DTypeSize(block_.dtype()))
                 : static_cast<double>(dist::EncodedBytes(bucket.codec, count));
  }
  return ring * bytes;
}

std::string DataParallel::bucket_algorithms() const {
  std::vector<std::string> seen;
  const size_t esize = DTypeSize(block_.dtype());
  for (const IssueRun& run : runs_) {
    const Bucket& b = buckets_[run.begin];
    const size_t bytes = static_cast<size_t>(buckets_[run.end - 1].end - b.begin) * esize;
    const char* at = static_cast<const char*>(block_.raw_data()) + b.begin * esize;
    std::string algo = b.codec != dist::CodecKind::kF32
                           ? "compressed ring"
                           : comm_.AllReduceAlgorithmFor(bytes, dist::Algorithm::kAuto, at);
    if (std::find(seen.begin(), seen.end(), algo) == seen.end()) seen.push_back(algo);
  }
  std::string out;
  for (const auto& a : seen) out += (out.empty() ? "" : ", ") + a;
  return out;
}

double DataParallel::f32_bytes_per_step() const {
  return 2.0 * (comm_.size() - 1) / comm_.size() * static_cast<double>(block_.numel()) *
         static_cast<double>(DTypeSize(block_.dtype()));
}

std::vector<Tensor> DataParallel::GatherResiduals() {
  CORTADO_CHECK(options_.error_feedback, "GatherResiduals without error feedback");
  WaitAll(true);
  const size_t n = static_cast<size_t>(residual_.numel());
  Tensor all({static_cast<int64_t>(n) * comm_.size()}, DType::kF32);
  comm_.AllGather(residual_.data<float>(), all.data<float>(), n, dist::DataType::kF32);
  std::vector<Tensor> out;
  for (int r = 0; r < comm_.size(); ++r) {
    Tensor t({static_cast<int64_t>(n)}, DType::kF32);
    std::memcpy(t.data<float>(), all.data<float>() + static_cast<size_t>(r) * n, n * 4);
    out.push_back(std::move(t));
  }
  return out;
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

void DataParallel::ScaleResidual(double factor) {
  if (residual_.empty()) return;
  float* r = residual_.data<float>();
  const float f = static_cast<float>(factor);
  ParallelFor(residual_.numel(), 65536, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) r[i] *= f;
  });
}

void DataParallel::SetResidual(const Tensor& residual) {
  CORTADO_CHECK(options_.error_feedback, "SetResidual without error feedback");
  CORTADO_CHECK(residual.dtype() == DType::kF32 && residual.numel() == residual_.numel(),
                "an error-feedback residual of ", residual.numel(), " ",
                DTypeName(residual.dtype()), " elements does not fit this model's ",
                residual_.numel(), " (the model or its parameters changed)");
  std::memcpy(residual_.data<float>(), residual.data<float>(),
              static_cast<size_t>(residual_.numel()) * 4);
}

DataParallel::StepResult DataParallel::FinishStep() {
  const auto t0 = Trace::Clock::now();
  // Backward has returned: every gradient is final, whatever the hook saw.
  std::fill(pending_.begin(), pending_.end(), 0);
  IssueReadyRuns();
  WaitAll(true);
  const auto t1 = Trace::Clock::now();
  last_wait_s_ = std::chrono::duration<double>(t1 - t0).count();
  last_comm_cpu_ = dist::ThreadCpu{};
  last_comm_wakeups_ = 0;
  for (const auto& w : work_) {
    last_comm_cpu_ += w->cpu();
    last_comm_wakeups_ += w->wakeups();
  }
  if (trace_ != nullptr) {
    const double esize = static_cast<double>(DTypeSize(block_.dtype()));
    for (size_t r = 0; r < runs_.size(); ++r) {
      const dist::Work& w = *work_[r];
      const dist::ThreadCpu cpu = w.cpu();
      const size_t b = runs_[r].begin, last = runs_[r].end - 1;
      trace_->Add(
          TraceTrack::kGradients,
          b == last ? StrCat("all-reduce bucket ", b) : StrCat("all-reduce buckets ", b, "-", last),
          "comm", queued_at_[r], w.finished_at(),
          {{"bytes", (buckets_[last].end - buckets_[b].begin) * esize},
           {"queued_ms",
            std::chrono::duration<double, std::milli>(w.started_at() - queued_at_[r]).count()},
           {"cpu_ms", 1000 * cpu.total_s},
           {"user_ms", 1000 * cpu.user_s},
           {"system_ms", 1000 * cpu.system_s},
           {"wakeups", static_cast<double>(w.wakeups())},
           {"codec_bits", static_cast<double>(dist::CodecBits(buckets_[b].codec))}});
    }
    trace_->Add(TraceTrack::kCompute, "wait for gradients", "comm", t0, t1,
                {{"comm_cpu_ms", 1000 * last_comm_cpu_.total_s},
                 {"comm_user_ms", 1000 * last_comm_cpu_.user_s},
                 {"comm_system_ms", 1000 * last_comm_cpu_.system_s},
                 {"comm_wakeups", static_cast<double>(last_comm_wakeups_)}});
  }
  const StepResult result{ControlWord(0) > 0, ControlWord(1)};
  if (options_.auto_codec.enabled) MeasureStep(t0, t1);
  return result;
}

// ---- distributed.codec: auto ----

namespace {

std::string PlanText(const std::vector<dist::CodecKind>& codecs) {
  std::string out;
  for (dist::CodecKind c : codecs) out += StrCat(out.empty() ? "" : ",", dist::CodecName(c));
  return out;
}

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
    const float* g = block_.data<float>();
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
            PlanText(trial_.narrow), ") take turns, a step each, ", ac.trial_steps,
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

void DataParallel::AdoptMeasurement(const std::vector<double>& m) {
  const size_t n = buckets_.size();
  agreed_link_ = LinkModel{m[0], m[1] > 0 ? 1.0 / m[1] : 0.0};
  agreed_backward_end_s_ = m[2];
  agreed_ready_s_.assign(m.begin() + 3, m.begin() + 3 + static_cast<int64_t>(n));
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

void DataParallel::SetCodecs(const std::vector<dist::CodecKind>& codecs) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (!auto_bucket_[b] || bucket.codec == codecs[b]) continue;
    if (UsesFeedback(bucket.codec) != UsesFeedback(codecs[b]) && !residual_.empty()) {
      // Between a codec with error feedback and one without, the residual starts from zero.
      const size_t bytes = static_cast<size_t>(bucket.end - bucket.begin) * 4;
      std::memset(residual_.data<float>() + bucket.begin, 0, bytes);
      if (!residual_kept_.empty())
        std::memset(residual_kept_.data<float>() + bucket.begin, 0, bytes);
    }
    bucket.codec = codecs[b];
  }
  CutRuns();
}

std::string DataParallel::codec_plan() const {
  std::vector<dist::CodecKind> codecs;
  for (const Bucket& b : buckets_) codecs.push_back(b.codec);
  return PlanText(codecs);
}

void DataParallel::SaveCodecPlan(Checkpoint& ckpt) const {
  if (!options_.auto_codec.enabled || !planned_) return;
  const size_t n = buckets_.size();
  // During a trial: the plan on trial, and a mark that starts the trial over on resume.
  ckpt.meta["codec_auto_plan"] = trial_.on ? PlanText(trial_.plan) : codec_plan();
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
