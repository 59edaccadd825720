#include "engine/graph/solver.h"

#include <algorithm>
#include <cmath>

#include "engine/tensor/device_kernels.h"
#include "engine/tensor/device_runtime.h"

namespace cortado {

SgdSolver::SgdSolver(std::vector<Param*> params, SgdOptions options)
    : params_(std::move(params)), options_(options) {
  for (Param* p : params_) {
    // Momentum lives where its parameter does (a device's memory for a net on a device).
    Buffer b{p->name + ".momentum",
             Tensor(p->value.shape(), p->value.dtype(), AllocatorFor(p->value.device()))};
    b.value.set_name(b.name);
    b.value.Zero();
    momentum_.push_back(std::move(b));
  }
}

void SgdSolver::Step(double lr, double grad_scale) {
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    double decay = options_.weight_decay * p.decay_mult;
    if (options_.no_decay_bn_bias && p.kind != ParamKind::kWeight) decay = 0;
    // The shared body (engine/tensor/kernel_bodies.h) on the parameter's device: a host loop on
    // the CPU, a kernel on a device, the same arithmetic.
    DeviceSgdStep(
        p.value, p.grad, momentum_[i].value,
        SgdStepArgs{lr * p.lr_mult, decay, options_.momentum, grad_scale, options_.nesterov});
  }
}

void SgdSolver::SaveState(Checkpoint& checkpoint) const {
  for (const Buffer& b : momentum_) checkpoint.Add("momentum/" + b.name, b.value);
}

void SgdSolver::LoadState(const Checkpoint& checkpoint, const std::string& path) {
  for (Buffer& b : momentum_) {
    const Tensor* t = checkpoint.Find("momentum/" + b.name);
    CORTADO_CHECK(t != nullptr && t->shape() == b.value.shape(), "checkpoint '", path,
                  "' has no matching solver state for '", b.name, "'");
    AssignConverted(b.value, *t);
  }
}

namespace {
constexpr std::pair<LrPolicy, const char*> kLrPolicies[] = {{LrPolicy::kFixed, "fixed"},
                                                            {LrPolicy::kStep, "step"},
                                                            {LrPolicy::kMultistep, "multistep"},
                                                            {LrPolicy::kCosine, "cosine"},
                                                            {LrPolicy::kPoly, "poly"}};
}  // namespace

std::optional<LrPolicy> FindLrPolicy(const std::string& name) {
  for (const auto& [policy, spelling] : kLrPolicies) {
    if (name == spelling) return policy;
  }
  return std::nullopt;
}

const char* LrPolicyName(LrPolicy policy) {
  for (const auto& [p, spelling] : kLrPolicies) {
    if (p == policy) return spelling;
  }
  return "?";
}

std::string LrPolicyNames() {
  std::string names;
  for (const auto& [policy, spelling] : kLrPolicies)
    names += (names.empty() ? "" : ", ") + std::string(spelling);
  return names;
}

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  CORTADO_CHECK(o.base_lr >= 0, "base_lr must be >= 0, got ", o.base_lr);
  CORTADO_CHECK(o.policy != LrPolicy::kStep || o.step_size > 0,
                "step_size must be > 0 for lr_policy step");
  CORTADO_CHECK(o.total > 0, "the schedule length must be positive");
  CORTADO_CHECK(o.warmup >= 0, "warmup must be >= 0, got ", o.warmup);
}

double LrSchedule::At(double t) const {
  const auto& o = options_;
  double lr = o.base_lr;
  switch (o.policy) {
    case LrPolicy::kFixed:
      break;
    case LrPolicy::kStep:
      lr = o.base_lr * std::pow(o.gamma, std::floor(t / o.step_size));
      break;
    case LrPolicy::kMultistep: {
      int passed = 0;
      for (double m : o.milestones) passed += t >= m ? 1 : 0;
      lr = o.base_lr * std::pow(o.gamma, passed);
      break;
    }
    case LrPolicy::kCosine: {
      const double f = std::clamp(t / o.total, 0.0, 1.0);
      lr = o.min_lr + (o.base_lr - o.min_lr) * 0.5 * (1.0 + std::cos(M_PI * f));
      break;
    }
    case LrPolicy::kPoly: {
      const double f = std::clamp(t / o.total, 0.0, 1.0);
      lr = o.min_lr + (o.base_lr - o.min_lr) * std::pow(1.0 - f, o.power);
      break;
    }
  }
  if (o.warmup > 0 && t < o.warmup) {
    double f = o.warmup_factor + (1.0 - o.warmup_factor) * (t / o.warmup);
    lr *= f;
  }
  return lr;
}

}  // namespace cortado
