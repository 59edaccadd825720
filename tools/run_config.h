// RunConfig: the whole training configuration (one YAML file plus --set overrides), parsed
// strictly: an unknown key, a wrong type or an out-of-range value stops before training with
// the key path and its line:column (or the --set argument). README.md documents every key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/data_options.h"
#include "engine/graph/loss_scaler.h"
#include "engine/graph/net.h"
#include "engine/graph/solver.h"
#include "engine/io/yaml_config.h"
#include "engine/parallel/data_parallel.h"

namespace cortado {

struct ModelConfig {
  std::string builder;            // a models/ builder name, or empty with `layers`
  std::vector<LayerSpec> layers;  // a YAML graph (instead of builder)
  int64_t num_classes = 0;        // 0: from the data
  int64_t in_channels = 0;        // 0: from the data
  double label_smoothing = 0.0;
  bool zero_init_residual = false;
  int64_t base_width = 0;        // ImageNet ResNets' first-stage channels; 0: 64
  std::string weights;           // a safetensors file to initialize from (tools/weights.h); "" none
  bool weights_partial = false;  // load what fits even outside the final classifier
  // Memory format of the activations: auto | nchw | nhwc (tools/net_setup.h resolves auto).
  std::string layout = "auto";
};

struct SolverConfig {
  SgdOptions sgd;
  LrScheduleOptions schedule;  // units: epochs when max_epochs is set, else iterations
  int64_t max_epochs = 0;
  int64_t max_iter = 0;
  bool epoch_based = true;
  double eval_interval = 1;  // in schedule units; 0: evaluate only at the end
};

struct CheckpointConfig {
  std::string dir;   // default: runs/<config file stem>
  double every = 1;  // in schedule units; 0: only at the end
  int keep = 3;
};

// The `distributed:` section: how ranks talk and how gradients and batch-norm statistics are
// combined. Rank and world size come from the launcher (tools/world.h).
struct DistributedConfig {
  std::string backend;           // cortado | mpi (tcp: cortado); "": CORTADO_BACKEND, else cortado
  std::string transport;         // tcp | ucx (under cortado); "": CORTADO_TRANSPORT, else tcp
  double bucket_mb = 25;         // gradient bucket size
  double first_bucket_mb = 1;    // the first bucket (the last layers), so comm starts early
  double last_bucket_mb = 1;     // the last bucket (the first layers): all of it is exposed
  bool overlap = true;           // all-reduce buckets during backward
  double timeout_s = 0;          // deadline of every collective; 0: CORTADO_TIMEOUT_S or 300
  double connect_timeout_s = 0;  // rendezvous deadline; 0: CORTADO_CONNECT_TIMEOUT_S or timeout
  bool sync_bn = false;          // synchronized batch norm, net-wide (a layer's `sync` wins)
  int sync_bn_group = 0;         // ranks per batch-norm group; 0: all ranks
  // Gradient compression (see engine/parallel/data_parallel.h, CodecPolicy).
  CodecPolicy codec;  // codec, codec_keep_f32, codec_overrides
  dist::Rounding rounding = dist::Rounding::kNearest;
  bool error_feedback = false;
  // codec: auto (codec_candidates, auto_warmup_steps, auto_interval, auto_max_residual_ratio,
  // auto_hiding_fraction, auto_trial_steps).
  AutoCodecOptions auto_codec;
};

// The `precision:` section. fp64 computes every layer, gradient and update in double: about
// 2-4x slower, for numerical reference runs (the data-parallel equivalence tests compare in it,
// where f32 rounding would flip single ReLUs between runs and hide what is being compared).
// bf16 and fp16 store activations and their gradients in 16 bits, with f32 master weights,
// momentum, batch-norm statistics, softmax and loss (engine/graph/layer.h); loss_scale is `dynamic`
// (engine/graph/loss_scaler.h), a number (a static scale) or 1 (none). Its default: dynamic for
// fp16, whose gradients underflow without it, and none otherwise (bf16 has f32's range).
struct PrecisionConfig {
  DType compute = DType::kF32;  // fp32 | fp64 | bf16 | fp16
  bool loss_scaling = false;    // loss_scale is dynamic or a number other than 1
  LossScalerOptions scaler;     // dynamic, init_scale (the static scale), growth and backoff
};

struct RunConfig {
  std::string file;
  uint64_t seed = 1;
  ModelConfig model;
  DataOptions data;
  SolverConfig solver;
  CheckpointConfig checkpoint;
  DistributedConfig distributed;
  PrecisionConfig precision;
  int64_t log_interval = 50;
  // `device:` (cpu, test[:N], cuda[:N]; --device sets it): where the net trains, checked usable.
  Device device = Device::CPU();
  std::string resolved_yaml;  // the document with overrides applied
};

// Parses `path` with the `--set` overrides applied in order. A missing file, a folder, or a
// file with no YAML in it (/dev/null) is refused naming the path and what was expected.
// need_train false (evaluation): data.train may be absent or missing on this machine.
// check_data false (inspect, a dry run's net): the data paths are taken as written, whether
// they exist here or not.
RunConfig LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                        bool need_train = true, bool check_data = true);
RunConfig ParseRunConfig(YamlConfig& yaml, bool need_train = true, bool check_data = true);

}  // namespace cortado
