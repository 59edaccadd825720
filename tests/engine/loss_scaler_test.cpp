// LossScaler: growth after the interval, backoff on overflow, static scales, the finiteness
// check over f32 gradients, option checks and the checkpoint round trip.
#include "engine/graph/loss_scaler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "engine/base/error.h"

namespace cortado {
namespace {

TEST(LossScaler, GrowsAfterTheIntervalAndBacksOffOnOverflow) {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  LossScaler s(o);
  EXPECT_EQ(s.Update(true), 1.0);
  EXPECT_EQ(s.Update(true), 1.0);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.Update(true), 2.0);  // the third clean step in a row
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.Update(true), 1.0);
  EXPECT_EQ(s.Update(false), 0.5);  // an overflow resets the streak
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.Update(true), 1.0);
  EXPECT_EQ(s.Update(true), 1.0);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.Update(true), 2.0);
  EXPECT_EQ(s.scale(), 2048);
}

TEST(LossScaler, PyTorchDefaultsAndAStaticScaleNeverChanges) {
  LossScaler d{LossScalerOptions{}};
  EXPECT_EQ(d.scale(), 65536);
  EXPECT_EQ(d.options().growth_interval, 2000);
  EXPECT_EQ(d.options().growth_factor, 2.0);
  EXPECT_EQ(d.options().backoff_factor, 0.5);
  LossScalerOptions o;
  o.dynamic = false;
  o.init_scale = 128;
  o.growth_interval = 1;
  LossScaler s(o);
  EXPECT_EQ(s.Update(true), 1.0);
  EXPECT_EQ(s.Update(false), 1.0);
  EXPECT_EQ(s.scale(), 128);
}

TEST(LossScaler, StopsGrowingBeforeF32Overflows) {
  LossScalerOptions o;
  o.init_scale = 0x1p126;
  o.growth_interval = 1;
  LossScaler s(o);
  EXPECT_EQ(s.Update(true), 2.0);
  EXPECT_EQ(s.scale(), 0x1p127);
  EXPECT_EQ(s.Update(true), 1.0);  // 2^128 is not an f32
  EXPECT_EQ(s.scale(), 0x1p127);
}

TEST(LossScaler, AllFiniteFindsInfAndNaNAnywhere) {
  std::vector<Param> params(2);
  params[0].grad = Tensor({5}, DType::kF32);
  params[1].grad = Tensor({300000}, DType::kF32);  // several parallel chunks
  params[0].grad.Fill(1e30);
  params[1].grad.Fill(-3);
  std::vector<Param*> all{&params[0], &params[1]};
  EXPECT_TRUE(LossScaler::AllFinite(all));
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    for (int64_t at : {int64_t{0}, int64_t{131071}, int64_t{299999}}) {
      params[1].grad.data<float>()[at] = bad;
      EXPECT_FALSE(LossScaler::AllFinite(all)) << bad << " at " << at;
      params[1].grad.data<float>()[at] = -3;
    }
  }
  params[0].grad.data<float>()[4] = NAN;
  EXPECT_FALSE(LossScaler::AllFinite(all));
}

TEST(LossScaler, BadOptionsNameTheKey) {
  auto error = [](LossScalerOptions o) {
    try {
      LossScaler s(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  LossScalerOptions o;
  o.backoff_factor = 1;
  EXPECT_NE(error(o).find("precision.backoff_factor"), std::string::npos);
  o = {};
  o.growth_factor = 1;
  EXPECT_NE(error(o).find("precision.growth_factor"), std::string::npos);
  o = {};
  o.init_scale = INFINITY;
  EXPECT_NE(error(o).find("precision.init_scale"), std::string::npos);
  o = {};
  o.growth_interval = 0;
  EXPECT_NE(error(o).find("precision.growth_interval"), std::string::npos);
}

TEST(LossScaler, CheckpointRoundTripAndChecks) {
  LossScalerOptions o;
  o.growth_interval = 4;
  LossScaler a(o);
  a.Update(false);
  a.Update(true);
  a.Update(true);
  Checkpoint c;
  a.SaveState(c);
  LossScaler b(o);
  b.LoadState(c, "x.cortado");
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.clean_steps(), 2);
  EXPECT_EQ(b.skipped_steps(), 1);
  // Two more clean steps grow both the same way.
  a.Update(true);
  b.Update(true);
  EXPECT_EQ(a.Update(true), b.Update(true));
  EXPECT_EQ(a.scale(), b.scale());
  // A damaged entry is refused naming the file: a scale that is not positive, and counts that
  // are not whole numbers an int64 holds (an infinite one was cast to int64: undefined).
  double* state = c.tensors[0].second.data<double>();
  const double good[3] = {state[0], state[1], state[2]};
  for (const auto& [i, bad] : std::vector<std::pair<int, double>>{
           {0, -1}, {1, INFINITY}, {2, INFINITY}, {1, NAN}, {2, 1e300}, {1, 2.5}, {2, -1}}) {
    std::copy(good, good + 3, state);
    state[i] = bad;
    try {
      b.LoadState(c, "x.cortado");
      ADD_FAILURE() << "state[" << i << "] = " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("checkpoint 'x.cortado': loss_scaler/state"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace cortado
