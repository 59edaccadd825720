// The run config's distributed: section (run_config_sections.h): backend, transport, buckets,
// timeouts, synchronized batch norm, and the gradient codecs (codec, its policy keys and
// distributed.codec: auto's settings), each codec key with its effective value in the resolved
// config.
#include <algorithm>

#include "tools/run_config_sections.h"

namespace cortado::run_config {
namespace {

// The YAML flow list of `items` (a structure's effective value, for the resolved config).
template <typename T, typename Name>
YAML::Node FlowList(const std::vector<T>& items, Name name) {
  YAML::Node list(YAML::NodeType::Sequence);
  for (const T& item : items) list.push_back(std::string(name(item)));
  list.SetStyle(YAML::EmitterStyle::Flow);
  return list;
}

constexpr std::pair<ParamKind, const char*> kParamKinds[] = {
    {ParamKind::kNorm, "batch_norm"}, {ParamKind::kBias, "bias"}, {ParamKind::kWeight, "weight"}};

const char* ParamKindName(ParamKind kind) {
  for (const auto& [k, name] : kParamKinds) {
    if (k == kind) return name;
  }
  return "?";
}

// distributed.codec_keep_f32: the parameter kinds every codec leaves in f32.
void ParseKeepF32(const YamlSection& dd, CodecPolicy& codec) {
  if (dd.Has("codec_keep_f32")) {
    YAML::Node kinds = dd.Node("codec_keep_f32");
    if (!kinds.IsSequence()) {
      dd.Error("codec_keep_f32", "must be a list of batch_norm, bias, weight");
    }
    codec.keep_f32.clear();
    for (const auto& k : kinds) {
      const std::string kind = k.IsScalar() ? k.as<std::string>() : "";
      const auto* known = std::find_if(std::begin(kParamKinds), std::end(kParamKinds),
                                       [&](const auto& p) { return kind == p.second; });
      if (known == std::end(kParamKinds)) {
        dd.Error("codec_keep_f32",
                 "unknown parameter kind '" + kind + "' (known: batch_norm, bias, weight)");
      }
      codec.keep_f32.push_back(known->first);
    }
  }
  // Resolved with the default too: read through Has and Node, no getter records it.
  dd.Resolve("codec_keep_f32", FlowList(codec.keep_f32, ParamKindName));
}

// distributed.codec_overrides as written: parameter-name patterns mapped to codecs.
void ReadCodecOverrides(const YamlSection& dd, CodecPolicy& codec) {
  if (!dd.Has("codec_overrides")) return;
  YAML::Node overrides = dd.Node("codec_overrides");
  if (!overrides.IsMap()) {
    dd.Error("codec_overrides", "must map parameter-name patterns to codecs, e.g. {\"fc.*\": f32}");
  }
  for (const auto& item : overrides) {
    if (!item.first.IsScalar()) {
      dd.Error("codec_overrides",
               "a key is not a name pattern (write patterns as strings, e.g. {\"fc.*\": f32})");
    }
    const std::string pattern = item.first.as<std::string>();
    const std::string name = item.second.IsScalar() ? item.second.as<std::string>() : "";
    try {
      codec.overrides.emplace_back(pattern, dist::CodecName(dist::ParseCodec(name)));
    } catch (const std::exception& e) {
      dd.Error("codec_overrides", "'" + pattern + "': " + e.what());
    }
  }
}

// distributed.codec_overrides, and its effective value in the resolved config.
void ParseCodecOverrides(const YamlSection& dd, CodecPolicy& codec) {
  // Resolved as read, codecs by their canonical names, in the written order (every entry, as
  // the policy keeps them); {} by default.
  ReadCodecOverrides(dd, codec);
  YAML::Node resolved(YAML::NodeType::Map);
  resolved.SetStyle(YAML::EmitterStyle::Flow);
  for (const auto& [pattern, name] : codec.overrides) resolved.force_insert(pattern, name);
  dd.Resolve("codec_overrides", resolved);
}

// distributed.codec, rounding and error_feedback: gradient compression.
void ParseCodec(const YamlSection& dd, DistributedConfig& dc) {
  dc.codec.codec = dd.String("codec", "f32");
  try {
    if (dc.codec.codec != "auto")
      dc.codec.codec = dist::CodecName(dist::ParseCodec(dc.codec.codec));
  } catch (const std::exception& e) {
    dd.Error("codec", std::string(e.what()) + " (or auto)");
  }
  AutoCodecOptions& ac = dc.auto_codec;
  ac.enabled = dc.codec.codec == "auto";
  if (ac.enabled) {
    // Read (and so resolved) only under auto.
    if (dd.Has("codec_candidates")) {
      YAML::Node list = dd.Node("codec_candidates");
      if (!list.IsSequence() || list.size() == 0) {
        dd.Error("codec_candidates", "must be a list of codecs, widest first, e.g. [f32, epgc8]");
      }
      ac.candidates.clear();
      for (const auto& item : list) {
        const std::string name = item.IsScalar() ? item.as<std::string>() : "";
        try {
          ac.candidates.push_back(dist::ParseCodec(name));
        } catch (const std::exception& e) {
          dd.Error("codec_candidates", e.what());
        }
        const size_t k = ac.candidates.size();
        if (k >= 2 &&
            dist::CodecBits(ac.candidates[k - 2]) <= dist::CodecBits(ac.candidates[k - 1])) {
          dd.Error("codec_candidates", std::string("must go from widest to narrowest, but ") +
                                           dist::CodecName(ac.candidates[k - 2]) +
                                           " comes before " +
                                           dist::CodecName(ac.candidates[k - 1]));
        }
      }
    }
    dd.Resolve("codec_candidates", FlowList(ac.candidates, dist::CodecName));
    ac.warmup_steps = dd.Int("auto_warmup_steps", ac.warmup_steps);
    Require(ac.warmup_steps >= 1, dd, "auto_warmup_steps", "must be >= 1");
    ac.interval = dd.Int("auto_interval", ac.interval);
    Require(ac.interval >= 0, dd, "auto_interval", "must be >= 0 (0: plan once)");
    ac.max_residual_ratio = dd.Float("auto_max_residual_ratio", ac.max_residual_ratio);
    Require(ac.max_residual_ratio > 0, dd, "auto_max_residual_ratio", "must be > 0");
    ac.hiding_fraction = dd.Float("auto_hiding_fraction", ac.hiding_fraction);
    Require(ac.hiding_fraction > 0 && ac.hiding_fraction <= 1, dd, "auto_hiding_fraction",
            "must be in (0, 1]");
    ac.trial_steps = dd.Int("auto_trial_steps", ac.trial_steps);
    Require(ac.trial_steps >= 0, dd, "auto_trial_steps", "must be >= 0 (0: no trial)");
  } else {
    for (const char* key :
         {"codec_candidates", "auto_warmup_steps", "auto_interval", "auto_max_residual_ratio",
          "auto_hiding_fraction", "auto_trial_steps"}) {
      Require(!dd.Has(key), dd, key, "is for distributed.codec: auto");
    }
  }
  try {
    dc.rounding = dist::ParseRounding(dd.String("rounding", "nearest"));
  } catch (const std::exception& e) {
    dd.Error("rounding", e.what());
  }
  dc.error_feedback = dd.Bool("error_feedback", false);
  ParseKeepF32(dd, dc.codec);
  ParseCodecOverrides(dd, dc.codec);
}

// A bucket size in MB, in (0, 4096].
double BucketMb(const YamlSection& dd, const std::string& key, double fallback) {
  const double mb = dd.Float(key, fallback);
  Require(mb > 0 && mb <= 4096, dd, key, "must be in (0, 4096]");
  return mb;
}

}  // namespace

constexpr std::string_view kDistributedKeys[] = {"backend",
                                                 "transport",
                                                 "bucket_mb",
                                                 "first_bucket_mb",
                                                 "last_bucket_mb",
                                                 "overlap",
                                                 "timeout_s",
                                                 "connect_timeout_s",
                                                 "sync_bn",
                                                 "sync_bn_group",
                                                 "codec",
                                                 "rounding",
                                                 "error_feedback",
                                                 "codec_keep_f32",
                                                 "codec_overrides",
                                                 "codec_candidates",
                                                 "auto_warmup_steps",
                                                 "auto_interval",
                                                 "auto_max_residual_ratio",
                                                 "auto_hiding_fraction",
                                                 "auto_trial_steps"};

std::span<const std::string_view> DistributedKeys() { return kDistributedKeys; }

DistributedConfig ParseDistributed(const YamlSection& dd) {
  DistributedConfig dc;
  dc.backend = dd.String("backend", "");
  Require(
      dc.backend.empty() || dc.backend == "cortado" || dc.backend == "tcp" || dc.backend == "mpi",
      dd, "backend", "must be cortado or mpi, got '" + dc.backend + "'");
  dc.transport = dd.String("transport", "");
  Require(dc.transport.empty() || dc.transport == "tcp" || dc.transport == "ucx", dd, "transport",
          "must be tcp or ucx, got '" + dc.transport + "'");
  dc.bucket_mb = BucketMb(dd, "bucket_mb", dc.bucket_mb);
  dc.first_bucket_mb = BucketMb(dd, "first_bucket_mb", dc.first_bucket_mb);
  dc.last_bucket_mb = BucketMb(dd, "last_bucket_mb", dc.last_bucket_mb);
  dc.overlap = dd.Bool("overlap", dc.overlap);
  dc.timeout_s = dd.Float("timeout_s", 0.0);
  Require(dc.timeout_s >= 0, dd, "timeout_s", "must be >= 0 (0: CORTADO_TIMEOUT_S, else 300)");
  dc.connect_timeout_s = dd.Float("connect_timeout_s", 0.0);
  Require(dc.connect_timeout_s >= 0, dd, "connect_timeout_s",
          "must be >= 0 (0: CORTADO_CONNECT_TIMEOUT_S, else timeout_s)");
  dc.sync_bn = dd.Bool("sync_bn", dc.sync_bn);
  const int64_t group = dd.Int("sync_bn_group", 0);
  Require(group >= 0 && group <= 1 << 20, dd, "sync_bn_group",
          "must be >= 1 (ranks per batch-norm group) or 0 (all ranks)");
  dc.sync_bn_group = static_cast<int>(group);
  ParseCodec(dd, dc);
  return dc;
}

}  // namespace cortado::run_config
