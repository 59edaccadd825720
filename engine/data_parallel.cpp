#include "engine/data_parallel.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "engine/error.h"
#include "engine/log.h"
#include "engine/thread_pool.h"

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
    try {
      blob = "S" + SerializeCheckpoint(make());
    } catch (const Error& e) {
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
  const dist::CodecKind fallback = dist::ParseCodec(policy.codec);
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
    if (std::find(policy.keep_f32.begin(), policy.keep_f32.end(), p->kind) !=
        policy.keep_f32.end()) {
      codec = dist::CodecKind::kF32;
    }
    bool matched = false;
    for (size_t i = 0; i < policy.overrides.size(); ++i) {
      if (fnmatch(policy.overrides[i].first.c_str(), p->name.c_str(), 0) != 0) continue;
      used[i] = true;
      if (!matched) codec = dist::ParseCodec(policy.overrides[i].second);
      matched = true;
    }
    p->codec = dist::CodecName(codec);
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
  std::vector<BucketedParam> planned(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    planned[i] = BucketedParam{order[i]->name, order[i]->grad.numel(), CodecOfParam(*order[i])};
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

  // The block is the communicator's registered memory: registered once, here, and on one host
  // over UCX mapped by the other ranks, whose all-reduces then read and write it directly.
  block_ = Tensor({plan.block_elements}, dtype, allocator_);
  block_.Zero();
  if (options_.error_feedback) {
    residual_ = Tensor({plan.block_elements}, DType::kF32);
    residual_.Zero();
    residual_kept_ = residual_.Clone();
  }
  for (size_t i = 0; i < order.size(); ++i) {
    order[i]->grad = block_.View(order[i]->grad.shape(), offset[i]);
  }
  pending_.assign(buckets_.size(), 0);
  work_.assign(buckets_.size(), nullptr);
  queued_at_.resize(buckets_.size());
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
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = buckets_[b].params;
    work_[b].reset();
  }
  next_issue_ = 0;
  SetControlWord(0, 0.0);
  SetControlWord(1, 0.0);
  // Kept for DiscardStep: the residual changes as each compressed bucket is encoded.
  if (options_.error_feedback) CopyCompressedRanges(residual_, residual_kept_);
}

void DataParallel::CopyCompressedRanges(const Tensor& from, Tensor& to) const {
  const float* src = from.data<float>();
  float* dst = to.data<float>();
  for (const Bucket& b : buckets_) {
    if (b.codec == dist::CodecKind::kF32) continue;  // f32 buckets never touch the residual
    std::memcpy(dst + b.begin, src + b.begin, static_cast<size_t>(b.end - b.begin) * 4);
  }
}

void DataParallel::DiscardStep() {
  WaitAll(true);
  if (options_.error_feedback) CopyCompressedRanges(residual_kept_, residual_);
}

void DataParallel::SetControl(double loss, bool stop_vote) {
  CORTADO_CHECK(next_issue_ < buckets_.size(),
                "SetControl after the last gradient bucket was issued");
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
    --pending_[it->second];
  }
  if (options_.overlap) IssueReadyBuckets();
}

void DataParallel::IssueReadyBuckets() {
  while (next_issue_ < buckets_.size() && pending_[next_issue_] == 0) Issue(next_issue_++);
}

void DataParallel::Issue(size_t b) {
  const Bucket& bucket = buckets_[b];
  const size_t esize = DTypeSize(block_.dtype());
  char* base = static_cast<char*>(block_.raw_data()) + static_cast<size_t>(bucket.begin) * esize;
  const size_t count = static_cast<size_t>(bucket.end - bucket.begin);
  queued_at_[b] = Trace::Clock::now();
  if (bucket.codec == dist::CodecKind::kF32) {
    work_[b] = comm_.AllReduceAsync(base, count, wire_type_, dist::ReduceOp::kAvg);
    return;
  }
  dist::Compression compression;
  compression.codec = bucket.codec;
  compression.rounding = options_.rounding;
  // A stream per (run, step, bucket): splitmix64 steps of the three.
  uint64_t h = options_.seed + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(step_) + 1);
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull + b;
  compression.seed = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  if (options_.error_feedback) compression.residual = residual_.data<float>() + bucket.begin;
  work_[b] = comm_.AllReduceCompressedAsync(reinterpret_cast<float*>(base), count,
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
  for (const Bucket& b : buckets_) {
    const size_t bytes = static_cast<size_t>(b.end - b.begin) * esize;
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
  if (saved_residuals_.empty()) return;
  ckpt.meta["error_feedback_ranks"] = std::to_string(saved_residuals_.size());
  for (size_t r = 0; r < saved_residuals_.size(); ++r) {
    ckpt.Add(StrCat("error_feedback/rank", r), saved_residuals_[r]);
  }
}

void DataParallel::LoadState(const Checkpoint& ckpt, const std::string& path) {
  saved_residuals_.clear();
  if (!ckpt.meta.count("error_feedback_ranks")) return;
  const int64_t ranks = ckpt.MetaInt("error_feedback_ranks");
  for (int64_t r = 0; r < ranks; ++r) {
    const Tensor* t = ckpt.Find(StrCat("error_feedback/rank", r));
    CORTADO_CHECK(t != nullptr, "checkpoint '", path, "' lacks error_feedback/rank", r);
    saved_residuals_.push_back(*t);
  }
  const bool root = comm_.rank() == 0;
  if (!options_.error_feedback) {
    if (root) LogWarning(ErrorFeedbackDropped(path));
    saved_residuals_.clear();
    return;
  }
  if (ranks == comm_.size()) {
    SetResidual(saved_residuals_[static_cast<size_t>(comm_.rank())]);
    return;
  }
  Tensor sum = saved_residuals_[0].Clone();
  for (size_t r = 1; r < saved_residuals_.size(); ++r) {
    CORTADO_CHECK(saved_residuals_[r].numel() == sum.numel(), "checkpoint '", path,
                  "': error-feedback residuals of different sizes");
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
  IssueReadyBuckets();
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
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const dist::Work& w = *work_[b];
      const dist::ThreadCpu cpu = w.cpu();
      trace_->Add(
          TraceTrack::kGradients, StrCat("all-reduce bucket ", b), "comm", queued_at_[b],
          w.finished_at(),
          {{"bytes", (buckets_[b].end - buckets_[b].begin) * esize},
           {"queued_ms",
            std::chrono::duration<double, std::milli>(w.started_at() - queued_at_[b]).count()},
           {"cpu_ms", 1000 * cpu.total_s},
           {"user_ms", 1000 * cpu.user_s},
           {"system_ms", 1000 * cpu.system_s},
           {"wakeups", static_cast<double>(w.wakeups())}});
    }
    trace_->Add(TraceTrack::kCompute, "wait for gradients", "comm", t0, t1,
                {{"comm_cpu_ms", 1000 * last_comm_cpu_.total_s},
                 {"comm_user_ms", 1000 * last_comm_cpu_.user_s},
                 {"comm_system_ms", 1000 * last_comm_cpu_.system_s},
                 {"comm_wakeups", static_cast<double>(last_comm_wakeups_)}});
  }
  return StepResult{ControlWord(0) > 0, ControlWord(1)};
}

}  // namespace cortado
