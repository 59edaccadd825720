// The run config's sections on how the weights are updated and kept (run_config_sections.h):
// solver: (SGD, the learning-rate schedule and its warm-up, the length of the run), checkpoint:,
// and precision: (compute dtype, loss scaling).
#include <cmath>
#include <filesystem>

#include "engine/base/error.h"
#include "engine/base/numbers.h"
#include "tools/run_config_sections.h"

namespace cortado::run_config {
namespace {

// The schedule's shape after base_lr: policy, its parameters and the warm-up.
void ParseSchedule(const YamlSection& s, SolverConfig& sv) {
  LrScheduleOptions& lr = sv.schedule;
  const std::optional<LrPolicy> policy = FindLrPolicy(s.String("lr_policy", "cosine"));
  Require(policy.has_value(), s, "lr_policy", "must be one of " + LrPolicyNames());
  lr.policy = *policy;
  lr.gamma = s.Float("gamma", 0.1);
  Require(lr.gamma > 0, s, "gamma", "must be positive");
  lr.step_size = s.Float("step_size", 30);
  Require(lr.step_size > 0, s, "step_size", "must be positive");
  lr.milestones = s.Floats("milestones", {});
  lr.power = s.Float("power", 1.0);
  lr.min_lr = s.Float("min_lr", 0.0);
  Require(lr.min_lr >= 0 && lr.min_lr <= lr.base_lr, s, "min_lr", "must be in [0, base_lr]");
  const char* warmup_key = sv.epoch_based ? "warmup_epochs" : "warmup_iters";
  lr.warmup = s.Float(warmup_key, 0.0);
  Require(lr.warmup >= 0, s, warmup_key, "must be >= 0");
  if (s.Has(sv.epoch_based ? "warmup_iters" : "warmup_epochs")) {
    s.Error(sv.epoch_based ? "warmup_iters" : "warmup_epochs",
            StrCat("use ", warmup_key, " with ", sv.epoch_based ? "max_epochs" : "max_iter"));
  }
  lr.warmup_factor = s.Float("warmup_factor", 0.0);
  Require(lr.warmup_factor >= 0 && lr.warmup_factor <= 1, s, "warmup_factor", "must be in [0, 1]");
  lr.total = static_cast<double>(sv.epoch_based ? sv.max_epochs : sv.max_iter);
}

}  // namespace

constexpr std::string_view kSolverKeys[] = {
    "base_lr",  "momentum",      "nesterov",     "weight_decay",  "no_decay_bn_bias", "max_epochs",
    "max_iter", "lr_policy",     "gamma",        "step_size",     "milestones",       "power",
    "min_lr",   "warmup_epochs", "warmup_iters", "warmup_factor", "eval_interval"};

std::span<const std::string_view> SolverKeys() { return kSolverKeys; }

// The warm-up key of the other schedule (warmup_iters where max_epochs is given alone), which
// ParseSchedule refuses naming the right one: never offered for a misspelled key. None while the
// schedule is unclear (ParseSolver then asks for exactly one of max_epochs or max_iter).
std::span<const std::string_view> OtherSchedulesKeys(const YamlSection& solver) {
  static constexpr std::string_view kEpochKeys[] = {"warmup_epochs"};
  static constexpr std::string_view kIterKeys[] = {"warmup_iters"};
  const bool epochs = solver.Has("max_epochs"), iters = solver.Has("max_iter");
  if (epochs == iters) return {};
  return epochs ? std::span<const std::string_view>(kIterKeys) : kEpochKeys;
}

SolverConfig ParseSolver(const YamlSection& s) {
  SolverConfig sv;
  sv.schedule.base_lr = s.Float("base_lr", 0.1);
  Require(sv.schedule.base_lr > 0, s, "base_lr", "must be positive");
  sv.sgd.momentum = s.Float("momentum", 0.9);
  Require(sv.sgd.momentum >= 0 && sv.sgd.momentum < 1, s, "momentum", "must be in [0, 1)");
  sv.sgd.nesterov = s.Bool("nesterov", false);
  sv.sgd.weight_decay = s.Float("weight_decay", 5e-4);
  Require(sv.sgd.weight_decay >= 0, s, "weight_decay", "must be >= 0");
  sv.sgd.no_decay_bn_bias = s.Bool("no_decay_bn_bias", false);
  sv.max_epochs = s.Int("max_epochs", 0);
  sv.max_iter = s.Int("max_iter", 0);
  Require(sv.max_epochs >= 0, s, "max_epochs", "must be positive");
  Require(sv.max_iter >= 0, s, "max_iter", "must be positive");
  Require((sv.max_epochs > 0) != (sv.max_iter > 0), s, "",
          "give exactly one of max_epochs or max_iter");
  sv.epoch_based = sv.max_epochs > 0;
  ParseSchedule(s, sv);
  sv.eval_interval = s.Float("eval_interval", sv.epoch_based ? 1.0 : 0.0);
  Require(sv.eval_interval >= 0, s, "eval_interval", "must be >= 0");
  return sv;
}

constexpr std::string_view kCheckpointKeys[] = {"dir", "every", "keep"};

std::span<const std::string_view> CheckpointKeys() { return kCheckpointKeys; }

CheckpointConfig ParseCheckpoint(const YamlSection& k, const std::string& file, bool epoch_based) {
  CheckpointConfig ck;
  const std::string stem = std::filesystem::path(file).stem().string();
  ck.dir = k.String("dir", "runs/" + (stem.empty() ? std::string("run") : stem));
  ck.every = k.Float("every", epoch_based ? 1.0 : 0.0);
  Require(ck.every >= 0, k, "every", "must be >= 0");
  ck.keep = static_cast<int>(k.Int("keep", 3));
  Require(ck.keep >= 1, k, "keep", "must be >= 1");
  return ck;
}

namespace {

// precision.loss_scale: dynamic (with its growth and backoff), a static scale, or 1 (none).
void ParseLossScale(const YamlSection& pr, const std::string& compute, PrecisionConfig& p) {
  LossScalerOptions& so = p.scaler;
  const std::string loss_scale = pr.String("loss_scale", compute == "fp16" ? "dynamic" : "1");
  if (loss_scale == "dynamic") {
    // Read (and so resolved) only here: with a static scale they must stay absent.
    so.init_scale = pr.Float("init_scale", so.init_scale);
    so.growth_factor = pr.Float("growth_factor", so.growth_factor);
    so.backoff_factor = pr.Float("backoff_factor", so.backoff_factor);
    so.growth_interval = pr.Int("growth_interval", so.growth_interval);
    so.dynamic = true;
    p.loss_scaling = true;
  } else {
    double value = 0;
    const bool number = ParseFiniteDouble(loss_scale, &value);
    Require(number && value > 0, pr, "loss_scale",
            "must be dynamic or a positive number, got '" + loss_scale + "'");
    so.dynamic = false;
    so.init_scale = value;
    p.loss_scaling = value != 1.0;
    Require(!pr.Has("init_scale") && !pr.Has("growth_interval") && !pr.Has("growth_factor") &&
                !pr.Has("backoff_factor"),
            pr, "loss_scale",
            "is static ('" + loss_scale +
                "'); init_scale, growth_factor, backoff_factor and growth_interval are for "
                "loss_scale: dynamic");
  }
  Require(std::isfinite(so.init_scale) && so.init_scale > 0, pr, "init_scale",
          "must be positive and finite");
  Require(so.growth_factor > 1 && std::isfinite(so.growth_factor), pr, "growth_factor",
          "must be > 1");
  Require(so.backoff_factor > 0 && so.backoff_factor < 1, pr, "backoff_factor",
          "must be in (0, 1)");
  Require(so.growth_interval >= 1, pr, "growth_interval", "must be >= 1");
}

}  // namespace

constexpr std::string_view kPrecisionKeys[] = {
    "compute", "loss_scale", "init_scale", "growth_factor", "backoff_factor", "growth_interval"};

std::span<const std::string_view> PrecisionKeys() { return kPrecisionKeys; }

PrecisionConfig ParsePrecision(const YamlSection& pr) {
  PrecisionConfig p;
  const std::string compute = pr.String("compute", "fp32");
  Require(compute == "fp32" || compute == "fp64" || compute == "bf16" || compute == "fp16", pr,
          "compute", "must be fp32, fp64, bf16 or fp16, got '" + compute + "'");
  p.compute = compute == "fp64"   ? DType::kF64
              : compute == "bf16" ? DType::kBF16
              : compute == "fp16" ? DType::kF16
                                  : DType::kF32;
  ParseLossScale(pr, compute, p);
  return p;
}

}  // namespace cortado::run_config
