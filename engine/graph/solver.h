// SGD with momentum (PyTorch's formulation) and the learning-rate schedules.
//
// Update per parameter p with gradient g (already averaged over ranks and unscaled):
//   d = g + weight_decay * decay_mult * p
//   v = momentum * v + d
//   p -= lr * lr_mult * (nesterov ? d + momentum * v : v)
// which matches torch.optim.SGD(dampening=0). The momentum buffers are the solver's state and
// are saved in checkpoints.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/graph/layer.h"
#include "engine/io/checkpoint.h"

namespace cortado {

struct SgdOptions {
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  bool no_decay_bn_bias = false;  // no weight decay on batch-norm parameters and biases
};

class SgdSolver : public CheckpointState {
 public:
  SgdSolver(std::vector<Param*> params, SgdOptions options);
  // Applies one update with learning rate lr; gradients are multiplied by grad_scale first
  // (1 / loss_scale for mixed precision).
  void Step(double lr, double grad_scale = 1.0);
  std::vector<Param*>& params() { return params_; }
  // Momentum buffers, one per parameter, named "<param>.momentum".
  std::vector<Buffer>& state() { return momentum_; }

  // Checkpoint state: "momentum/<param>.momentum" per parameter.
  void SaveState(Checkpoint& checkpoint) const override;
  void LoadState(const Checkpoint& checkpoint, const std::string& path) override;

 private:
  std::vector<Param*> params_;
  SgdOptions options_;
  std::vector<Buffer> momentum_;
};

// How the learning rate moves: fixed; step (x gamma every step_size units); multistep (x gamma
// at each milestone); cosine (to min_lr at the end); poly ((1 - t/T)^power, to min_lr).
enum class LrPolicy { kFixed, kStep, kMultistep, kCosine, kPoly };
// The policy named `name` ("fixed", "step", ...), or nullopt.
std::optional<LrPolicy> FindLrPolicy(const std::string& name);
const char* LrPolicyName(LrPolicy policy);
// "fixed, step, multistep, cosine, poly": for errors.
std::string LrPolicyNames();

// Learning rate as a function of training progress, measured in the schedule's unit
// (epochs, fractional, or iterations).
struct LrScheduleOptions {
  LrPolicy policy = LrPolicy::kCosine;
  double base_lr = 0.1;
  double gamma = 0.1;              // step, multistep: factor per decay
  double step_size = 30;           // step: decay every step_size units
  std::vector<double> milestones;  // multistep: decay at these units
  double power = 1.0;              // poly: (1 - t/T)^power
  double min_lr = 0.0;             // cosine, poly: the floor
  double warmup = 0.0;             // linear warmup length in units (from warmup_factor)
  double warmup_factor = 0.0;      // warmup starts at base_lr * warmup_factor
  double total = 1.0;              // length of training in units (cosine, poly)
};

class LrSchedule {
 public:
  explicit LrSchedule(LrScheduleOptions options);
  double At(double progress) const;
  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

}  // namespace cortado
