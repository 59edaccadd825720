#include "engine/graph/solver.h"

#include <gtest/gtest.h>

#include <cmath>

namespace cortado {
namespace {

Param MakeParam(std::vector<double> values, ParamKind kind = ParamKind::kWeight) {
  Param p;
  p.name = "w";
  p.kind = kind;
  p.value = Tensor({static_cast<int64_t>(values.size())}, DType::kF64);
  p.grad = Tensor({static_cast<int64_t>(values.size())}, DType::kF64);
  for (size_t i = 0; i < values.size(); ++i) p.value.data<double>()[i] = values[i];
  return p;
}

// Golden values from torch.optim.SGD (torch 1.13.0, float64): lr 0.1, momentum 0.9,
// weight_decay 0.01, three steps with the gradients below.
void CheckAgainstTorch(bool nesterov, const double expected[3]) {
  Param p = MakeParam({1.0, -2.0, 0.5});
  SgdSolver solver({&p}, SgdOptions{0.9, nesterov, 0.01, false});
  const double grads[3][3] = {{0.5, -1.0, 0.25}, {0.1, 0.2, -0.3}, {-0.4, 0.0, 1.0}};
  for (const auto& g : grads) {
    for (int i = 0; i < 3; ++i) p.grad.data<double>()[i] = g[i];
    solver.Step(0.1);
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p.value.data<double>()[i], expected[i], 1e-14) << i;
}

TEST(SgdSolver, MatchesTorchMomentum) {
  const double expected[3] = {0.88009474899999995, -1.7561494979999999, 0.38651237449999998};
  CheckAgainstTorch(false, expected);
}

TEST(SgdSolver, MatchesTorchNesterov) {
  const double expected[3] = {0.86946555819100002, -1.695186716382, 0.30145642909549997};
  CheckAgainstTorch(true, expected);
}

TEST(SgdSolver, NoDecayOnNormAndBiasAndGradScale) {
  Param w = MakeParam({1.0});
  Param b = MakeParam({1.0}, ParamKind::kBias);
  SgdSolver solver({&w, &b}, SgdOptions{0.0, false, 0.5, true});
  w.grad.data<double>()[0] = 4.0;
  b.grad.data<double>()[0] = 4.0;
  solver.Step(0.1, 0.25);  // grads scaled to 1.0
  EXPECT_DOUBLE_EQ(w.value.data<double>()[0], 1.0 - 0.1 * (1.0 + 0.5));
  EXPECT_DOUBLE_EQ(b.value.data<double>()[0], 1.0 - 0.1 * 1.0);
}

TEST(LrSchedule, Policies) {
  LrScheduleOptions o;
  o.base_lr = 1.0;
  o.total = 10;
  o.policy = LrPolicy::kCosine;
  EXPECT_DOUBLE_EQ(LrSchedule(o).At(0), 1.0);
  EXPECT_NEAR(LrSchedule(o).At(5), 0.5, 1e-12);
  EXPECT_NEAR(LrSchedule(o).At(10), 0.0, 1e-12);
  o.policy = LrPolicy::kStep;
  o.step_size = 3;
  o.gamma = 0.5;
  EXPECT_DOUBLE_EQ(LrSchedule(o).At(2.9), 1.0);
  EXPECT_DOUBLE_EQ(LrSchedule(o).At(6.0), 0.25);
  o.policy = LrPolicy::kMultistep;
  o.milestones = {2, 5};
  EXPECT_DOUBLE_EQ(LrSchedule(o).At(4), 0.5);
  EXPECT_DOUBLE_EQ(LrSchedule(o).At(5), 0.25);
  o.policy = LrPolicy::kPoly;
  o.power = 2;
  EXPECT_NEAR(LrSchedule(o).At(5), 0.25, 1e-12);
  o.policy = LrPolicy::kFixed;
  o.warmup = 2;
  o.warmup_factor = 0.0;
  EXPECT_DOUBLE_EQ(LrSchedule(o).At(1), 0.5);
  EXPECT_DOUBLE_EQ(LrSchedule(o).At(3), 1.0);
  o.policy = LrPolicy::kStep;
  o.step_size = 0;
  EXPECT_THROW(LrSchedule{o}, Error);
}

TEST(LrSchedule, PolicyNamesRoundTripAndUnknownOnesAreNotFound) {
  for (LrPolicy p : {LrPolicy::kFixed, LrPolicy::kStep, LrPolicy::kMultistep, LrPolicy::kCosine,
                     LrPolicy::kPoly}) {
    EXPECT_EQ(FindLrPolicy(LrPolicyName(p)), p);
  }
  EXPECT_FALSE(FindLrPolicy("exponential").has_value());
  EXPECT_FALSE(FindLrPolicy("Cosine").has_value());
  EXPECT_EQ(LrPolicyNames(), "fixed, step, multistep, cosine, poly");
}

}  // namespace
}  // namespace cortado
