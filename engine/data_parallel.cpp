#include "engine/data_parallel.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "engine/error.h"

namespace cortado {
namespace {

constexpr int64_t kAlignBytes = 64;  // each gradient starts on a cache line (vector loads)

int64_t AlignUp(int64_t elements, int64_t esize) {
  const int64_t per_line = std::max<int64_t>(1, kAlignBytes / esize);
  return (elements + per_line - 1) / per_line * per_line;
}

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

dist::DataType WireTypeOf(DType dtype, const std::string& what) {
  if (dtype == DType::kF32) return dist::DataType::kF32;
  if (dtype == DType::kF64) return dist::DataType::kF64;
  Fail(what, ": data-parallel training supports f32 and f64 tensors, got ", DTypeName(dtype));
}

DataParallel::DataParallel(Net& net, dist::Communicator& comm, DataParallelOptions options)
    : net_(net), comm_(comm), options_(options) {
  CORTADO_CHECK(options_.bucket_mb > 0 && options_.first_bucket_mb > 0 &&
                    options_.last_bucket_mb > 0,
                "gradient bucket sizes must be positive (distributed.bucket_mb ",
                options_.bucket_mb, ", first_bucket_mb ", options_.first_bucket_mb,
                ", last_bucket_mb ", options_.last_bucket_mb, ")");
  // Parameters in the order backward finishes them: layers in reverse.
  std::vector<Param*> order;
  for (auto it = net_.layers().rbegin(); it != net_.layers().rend(); ++it) {
    for (Param& p : (*it)->params()) order.push_back(&p);
  }
  CORTADO_CHECK(!order.empty(), "the net has no parameters to train");
  const DType dtype = order.front()->grad.dtype();
  for (Param* p : order) {
    CORTADO_CHECK(p->grad.dtype() == dtype, "parameter '", p->name, "' is ",
                  DTypeName(p->grad.dtype()), " but '", order.front()->name, "' is ",
                  DTypeName(dtype), "; data-parallel gradients need one dtype");
  }
  wire_type_ = WireTypeOf(dtype, "gradient of '" + order.front()->name + "'");
  const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));

  // Bucket boundaries, between whole parameters: bucket 0 (the net's last layers, ready first)
  // up to first_bucket_mb, so communication starts early; the last bucket (the first layers,
  // ready only when backward ends, so its whole all-reduce is exposed) up to last_bucket_mb;
  // bucket_mb for those between.
  const auto elements = [&](double mb) {
    return std::max<int64_t>(1, static_cast<int64_t>(mb * 1048576.0 / esize));
  };
  // Bucket 0 first, then the last bucket from what remains, then the middle.
  std::vector<size_t> starts{0};
  size_t head = 0;  // bucket 0 is order[0, head)
  for (int64_t n = 0; head < order.size(); ++head) {
    n += order[head]->grad.numel();
    if (n > elements(options_.first_bucket_mb) && head > 0) break;
  }
  size_t tail = order.size();  // the last bucket is order[tail, end)
  for (int64_t n = 0; tail > head;) {
    n += order[tail - 1]->grad.numel();
    if (n > elements(options_.last_bucket_mb) && tail < order.size()) break;
    --tail;
  }
  for (size_t i = head, n = 0; i < tail; ++i) {
    const int64_t numel = order[i]->grad.numel();
    if (i == head || static_cast<int64_t>(n) + numel > elements(options_.bucket_mb)) {
      starts.push_back(i);
      n = 0;
    }
    n += static_cast<size_t>(numel);
  }
  if (tail < order.size()) starts.push_back(tail);

  // Offsets in the block: each gradient on a cache line.
  int64_t at = 0;
  std::vector<int64_t> offset(order.size());
  for (size_t b = 0; b < starts.size(); ++b) {
    const size_t end = b + 1 < starts.size() ? starts[b + 1] : order.size();
    Bucket bucket{at, at, static_cast<int>(end - starts[b]), order[starts[b]]->name,
                  order[end - 1]->name};
    for (size_t i = starts[b]; i < end; ++i) {
      offset[i] = at;
      bucket_of_[order[i]] = b;
      at = AlignUp(at + order[i]->grad.numel(), esize);
    }
    bucket.end = at;
    buckets_.push_back(bucket);
  }
  control_index_ = at;
  buckets_.back().end = control_index_ + 2;  // the control words ride in the last bucket

  block_ = Tensor({buckets_.back().end}, dtype);
  block_.Zero();
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
    report = StrCat("rank ", comm_.rank(), " has ", quoted(b, k), " where rank 0 has ",
                    quoted(a, k));
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
    Fail("rank(s) ", ranks, " do not run the same job as rank 0 (every rank needs the same config, "
         "model and data): ", details);
  }
}

void DataParallel::BeginStep() {
  WaitAll(true);  // nothing may still write the block (a step that failed halfway)
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = buckets_[b].params;
    work_[b].reset();
  }
  next_issue_ = 0;
  SetControlWord(0, 0.0);
  SetControlWord(1, 0.0);
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
  queued_at_[b] = Trace::Clock::now();
  work_[b] = comm_.AllReduceAsync(base, static_cast<size_t>(bucket.end - bucket.begin),
                                  wire_type_, dist::ReduceOp::kAvg);
}

DataParallel::StepResult DataParallel::FinishStep() {
  const auto t0 = Trace::Clock::now();
  // Backward has returned: every gradient is final, whatever the hook saw.
  std::fill(pending_.begin(), pending_.end(), 0);
  IssueReadyBuckets();
  WaitAll(true);
  const auto t1 = Trace::Clock::now();
  last_wait_s_ = std::chrono::duration<double>(t1 - t0).count();
  if (trace_ != nullptr) {
    const double esize = static_cast<double>(DTypeSize(block_.dtype()));
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const dist::Work& w = *work_[b];
      trace_->Add(TraceTrack::kGradients, StrCat("all-reduce bucket ", b), "comm", queued_at_[b],
                  w.finished_at(),
                  {{"bytes", (buckets_[b].end - buckets_[b].begin) * esize},
                   {"queued_ms", std::chrono::duration<double, std::milli>(w.started_at() -
                                                                          queued_at_[b])
                                     .count()}});
    }
    trace_->Add(TraceTrack::kCompute, "wait for gradients", "comm", t0, t1);
  }
  return StepResult{ControlWord(0) > 0, ControlWord(1)};
}

}  // namespace cortado
