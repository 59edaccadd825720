// DataParallel's core (data_parallel.h): construction (the flat gradient block, its buckets and
// their issue runs), the step (BeginStep, the gradient-ready hook issuing complete runs,
// SetControl, FinishStep) and what the start-up log reports of the buckets. The rest of the class
// is defined beside it: data_parallel_codecs.cpp (codec policy, error-feedback residuals),
// data_parallel_auto_measure.cpp and data_parallel_auto_decide.cpp (distributed.codec: auto),
// data_parallel_state.cpp (checkpoint state, rank 0's state and job at start-up).
#include "engine/parallel/data_parallel.h"

#include <algorithm>

#include "engine/base/error.h"
#include "engine/tensor/device_runtime.h"

namespace cortado {

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
    : net_(net), comm_(comm), options_(options), device_(net.device()) {
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

  // On the CPU the block is the communicator's registered memory: registered once, here, and on
  // one host over UCX mapped by the other ranks, whose all-reduces then read and write it
  // directly. On a device the block is device memory, and the all-reduces run on a host staging
  // block of the same layout, pinned so that each bucket's copy out runs asynchronously.
  if (device_ == Device::CPU()) {
    block_ = Tensor({plan.block_elements}, dtype, allocator_);
    block_.Zero();
    staging_ = block_;
  } else {
    block_ = Tensor({plan.block_elements}, dtype, AllocatorFor(device_));
    block_.Zero();
    staging_ = Tensor({plan.block_elements}, dtype, RuntimeFor(device_).PinnedHostAllocator());
    staging_.Zero();
    copied_.resize(buckets_.size());
  }
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
  WaitCopies(false);
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

// A device's bucket copies (copied_): how many elements of bucket b travel between the device
// block and the host staging. The control words, after the last parameter, live on the host only:
// SetControl writes them there while the copies run.
int64_t DataParallel::CopiedElements(size_t b) const {
  const Bucket& bucket = buckets_[b];
  return std::max<int64_t>(0, std::min(bucket.end, control_index_) - bucket.begin);
}

void DataParallel::CopyOut(size_t b) {
  if (copied_[b]) return;
  const int64_t n = CopiedElements(b), at = buckets_[b].begin;
  Tensor host = staging_.View({n}, at);
  copied_[b] = RuntimeFor(device_).CopyToHostAsync(host, block_.View({n}, at));
}

bool DataParallel::OnHost(size_t run, bool wait) {
  if (device_ == Device::CPU()) return true;
  for (size_t b = runs_[run].begin; b < runs_[run].end; ++b) {
    CORTADO_ASSERT(copied_[b] != nullptr);
    if (wait) {
      copied_[b]->Wait();
    } else if (!copied_[b]->Reached()) {
      return false;
    }
  }
  return true;
}

void DataParallel::CopyBack(size_t run) {
  if (device_ == Device::CPU()) return;
  for (size_t b = runs_[run].begin; b < runs_[run].end; ++b) {
    const int64_t n = CopiedElements(b), at = buckets_[b].begin;
    if (n == 0) continue;
    Tensor dst = block_.View({n}, at);
    // From pinned memory: queued, ahead of the solver's step on the same stream.
    RuntimeFor(device_).Copy(dst, staging_.View({n}, at));
  }
}

void DataParallel::WaitCopies(bool rethrow) {
  for (auto& event : copied_) {
    if (!event) continue;
    if (rethrow) {
      event->Wait();
    } else {
      try {
        event->Wait();
      } catch (...) {
      }
    }
  }
}

void DataParallel::BeginStep(int64_t step) {
  step_ = step;
  WaitAll(true);  // nothing may still write the block (a step that failed halfway)
  WaitCopies(true);
  for (auto& event : copied_) event.reset();
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

void DataParallel::SetControl(double loss, bool stop_vote) {
  CORTADO_CHECK(next_run_ < runs_.size(), "SetControl after the last gradient bucket was issued");
  SetControlWord(0, stop_vote ? 1.0 : 0.0);
  SetControlWord(1, loss);
}

void DataParallel::SetControlWord(int i, double value) {
  DispatchFloat(staging_.dtype(), "gradient block", [&](auto zero) {
    using T = decltype(zero);
    staging_.data<T>()[control_index_ + i] = static_cast<T>(value);
  });
}

double DataParallel::ControlWord(int i) const {
  return ElementAsDouble(staging_, control_index_ + i);
}

void DataParallel::OnGradientsReady(std::vector<Param>& params) {
  for (Param& p : params) {
    auto it = bucket_of_.find(&p);
    CORTADO_ASSERT(it != bucket_of_.end());
    if (--pending_[it->second] == 0) {
      ready_at_[it->second] = Trace::Clock::now();
      ready_seen_[it->second] = true;
      // On a device the bucket's copy out is queued behind the backward that finished it.
      if (options_.overlap && device_ != Device::CPU()) CopyOut(it->second);
    }
  }
  if (options_.overlap) IssueReadyRuns(/*wait=*/false);
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

void DataParallel::IssueReadyRuns(bool wait) {
  while (next_run_ < runs_.size()) {
    const IssueRun& run = runs_[next_run_];
    for (size_t b = run.begin; b < run.end; ++b) {
      if (pending_[b] != 0) return;
      // A bucket without parameters (the control words alone) is complete from the start.
      if (device_ != Device::CPU()) CopyOut(b);
    }
    // On a device a run goes out once its copies have reached the host staging; during backward
    // without waiting for them (the next hook looks again).
    if (!OnHost(next_run_, wait)) return;
    Issue(next_run_++);
  }
}

void DataParallel::Issue(size_t r) {
  // A run of several buckets is f32 (MergeRuns joins only those): one all-reduce over their
  // joined range. A compressed bucket runs alone, and its stream is seeded by its index.
  const size_t b = runs_[r].begin;
  const Bucket& bucket = buckets_[b];
  const size_t esize = DTypeSize(block_.dtype());
  char* base = static_cast<char*>(staging_.raw_data()) + static_cast<size_t>(bucket.begin) * esize;
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
    const char* at = static_cast<const char*>(staging_.raw_data()) + b.begin * esize;
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

DataParallel::StepResult DataParallel::FinishStep() {
  const auto t0 = Trace::Clock::now();
  // Backward has returned: every gradient is final, whatever the hook saw.
  std::fill(pending_.begin(), pending_.end(), 0);
  if (device_ != Device::CPU()) {
    // Every copy out queued first (without overlap all of them are queued here), then each
    // run goes out as soon as its own copies have reached the host.
    for (size_t b = 0; b < buckets_.size(); ++b) CopyOut(b);
  }
  IssueReadyRuns(/*wait=*/true);
  if (device_ != Device::CPU()) {
    // Every copy out has run: an error of the device's queued work surfaces here, before the
    // reduced gradients go back.
    RuntimeFor(device_).Synchronize(device_.index);
    for (size_t r = 0; r < runs_.size(); ++r) {
      work_[r]->Wait();
      CopyBack(r);  // while the later runs are still being reduced
    }
  }
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

}  // namespace cortado
