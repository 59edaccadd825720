// Gradient codecs in DataParallel (data_parallel.h, "Gradient codecs"): the run's codec policy
// (which codec each parameter travels in), and error feedback: which buckets keep a residual, the
// residual block's copies for a discarded step, its scaling, gathering and restoring, and what a
// change of a bucket's codec does to it.
#include <fnmatch.h>

#include <algorithm>
#include <cstring>

#include "engine/base/error.h"
#include "engine/base/thread_pool.h"
#include "engine/parallel/data_parallel.h"

namespace cortado {

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

}  // namespace cortado
