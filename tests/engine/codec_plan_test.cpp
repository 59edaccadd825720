// The `codec: auto` planner as a table: link speed and hiding time in, codecs out.
#include "engine/parallel/codec_plan.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/base/error.h"

namespace cortado {
namespace {

using dist::CodecKind;

const std::vector<CodecKind> kCandidates = {CodecKind::kF32, CodecKind::kBF16, CodecKind::kEpgc11,
                                            CodecKind::kEpgc8};

// ResNet-50-like: 100 MB of f32 gradients in 5 buckets over a 3 s backward; the first bucket is
// ready early, the last when backward ends.
CodecPlanInput Resnet50Like(double bytes_per_s) {
  CodecPlanInput in;
  in.buckets = {{0.2, 4e6}, {0.9, 26e6}, {1.6, 26e6}, {2.3, 26e6}, {3.0, 18e6}};
  in.backward_end_s = 3.0;
  in.world_size = 2;
  in.link = LinkModel{50e-6, bytes_per_s};
  in.candidates = kCandidates;
  return in;
}

std::vector<CodecKind> Codecs(const std::vector<PlannedBucket>& plan) {
  std::vector<CodecKind> codecs;
  for (const PlannedBucket& b : plan) codecs.push_back(b.codec);
  return codecs;
}

TEST(CodecPlan, AFastLinkKeepsF32WhereTransfersHide) {
  // 10 Gbit/s: 26 MB takes 21 ms; every bucket but the last finishes long before backward ends.
  const auto plan = PlanCodecs(Resnet50Like(1.25e9));
  for (size_t b = 0; b + 1 < plan.size(); ++b) {
    EXPECT_EQ(plan[b].codec, CodecKind::kF32) << b;
    EXPECT_TRUE(plan[b].hidden) << b;
  }
  // The last bucket is ready when backward ends: nothing hides it, so it travels narrowest.
  EXPECT_EQ(plan.back().codec, CodecKind::kEpgc8);
  EXPECT_FALSE(plan.back().hidden);
}

TEST(CodecPlan, ASlowLinkNarrowsTheLastReadyBucketsFirst) {
  // 1 Gbit/s: a 26 MB bucket takes 0.21 s in f32, 0.11 s in bf16; 0.7 s between buckets hides
  // the early ones in f32, and the queue behind them pushes the later ones narrower.
  const auto plan = PlanCodecs(Resnet50Like(125e6));
  EXPECT_EQ(plan[0].codec, CodecKind::kF32);
  EXPECT_EQ(plan[1].codec, CodecKind::kF32);
  EXPECT_EQ(plan.back().codec, CodecKind::kEpgc8);
  // 100 Mbit/s: f32 fits nowhere after the first bucket; codecs never widen toward the end.
  const auto slow = PlanCodecs(Resnet50Like(12.5e6));
  for (size_t b = 1; b < slow.size(); ++b) {
    EXPECT_GE(dist::CodecBits(slow[b - 1].codec), dist::CodecBits(slow[b].codec)) << b;
  }
  EXPECT_NE(slow[1].codec, CodecKind::kF32);
}

TEST(CodecPlan, PrecisionGoesWhereItExposesNothingMoreThanTheNarrowest) {
  // 100 Mbit/s: f32 for the first bucket (ready early, small), bf16 for the second; after that
  // the queue leaves room for nothing wider than epgc8. The end of communication is what the
  // narrowest codec everywhere would give.
  CodecPlanInput in = Resnet50Like(12.5e6);
  const auto plan = PlanCodecs(in);
  EXPECT_EQ(Codecs(plan),
            (std::vector<CodecKind>{CodecKind::kF32, CodecKind::kBF16, CodecKind::kEpgc8,
                                    CodecKind::kEpgc8, CodecKind::kEpgc8}));
  in.candidates = {CodecKind::kEpgc8};
  EXPECT_NEAR(plan.back().finish_s, PlanCodecs(in).back().finish_s, 1e-9);
}

TEST(CodecPlan, WhereNothingFitsTheNarrowestIsChosen) {
  const auto plan = PlanCodecs(Resnet50Like(1e5));  // 100 KB/s: nothing hides
  EXPECT_EQ(Codecs(plan), std::vector<CodecKind>(5, CodecKind::kEpgc8));
  for (const PlannedBucket& b : plan) EXPECT_FALSE(b.hidden);
}

TEST(CodecPlan, TransfersQueueBehindEachOther) {
  CodecPlanInput in = Resnet50Like(125e6);
  in.candidates = {CodecKind::kF32};
  const auto plan = PlanCodecs(in);
  for (size_t b = 1; b < plan.size(); ++b) {
    EXPECT_GE(plan[b].start_s, plan[b - 1].finish_s) << b;
    EXPECT_GE(plan[b].start_s, in.buckets[b].ready_s) << b;
  }
  // 2 ranks: 2 steps of latency and the bytes once.
  EXPECT_DOUBLE_EQ(plan[0].finish_s - plan[0].start_s, 2 * 50e-6 + 4e6 / 125e6);
}

// Buckets the plan does not choose for (kept in f32, or an override's codec) travel in theirs,
// and the others queue around them.
TEST(CodecPlan, FixedBucketsKeepTheirCodecAndTakeTheirPlaceInTheQueue) {
  CodecPlanInput in = Resnet50Like(1e5);  // nothing hides: every free bucket in epgc8
  in.buckets[1].fixed = true;             // codec f32
  in.buckets[3].fixed = true;
  in.buckets[3].codec = CodecKind::kBF16;
  const auto plan = PlanCodecs(in);
  EXPECT_EQ(Codecs(plan),
            (std::vector<CodecKind>{CodecKind::kEpgc8, CodecKind::kF32, CodecKind::kEpgc8,
                                    CodecKind::kBF16, CodecKind::kEpgc8}));
  // The fixed f32 bucket's 26 MB take 2 steps of latency and the bytes once at 100 KB/s.
  EXPECT_DOUBLE_EQ(plan[1].finish_s - plan[1].start_s, 2 * 50e-6 + 26e6 / 1e5);
  // ScheduleCodecs predicts the same queue for the same codecs, whatever it is told for fixed
  // buckets.
  std::vector<CodecKind> asked = Codecs(plan);
  asked[1] = CodecKind::kEpgc8;
  const auto again = ScheduleCodecs(in, asked);
  for (size_t b = 0; b < plan.size(); ++b) {
    EXPECT_EQ(again[b].codec, plan[b].codec) << b;
    EXPECT_DOUBLE_EQ(again[b].finish_s, plan[b].finish_s) << b;
  }
  EXPECT_THROW(ScheduleCodecs(in, {CodecKind::kF32}), Error);
}

TEST(CodecPlan, TheGuardWidensOneStepWhereTheResidualIsTooLarge) {
  const std::vector<CodecKind> codecs = {CodecKind::kF32, CodecKind::kEpgc8, CodecKind::kEpgc11,
                                         CodecKind::kBF16};
  const auto widened = Widen(codecs, {0.9, 0.5, 0.01, 0.2}, 0.1, kCandidates);
  EXPECT_EQ(widened, (std::vector<CodecKind>{CodecKind::kF32, CodecKind::kEpgc11,
                                             CodecKind::kEpgc11, CodecKind::kF32}));
}

TEST(CodecPlan, RefusesWhatCannotBePlanned) {
  CodecPlanInput in = Resnet50Like(125e6);
  in.candidates = {CodecKind::kEpgc8, CodecKind::kF32};
  EXPECT_THROW(PlanCodecs(in), Error);
  in.candidates = {};
  EXPECT_THROW(PlanCodecs(in), Error);
  in = Resnet50Like(0);
  EXPECT_THROW(PlanCodecs(in), Error);
  in = Resnet50Like(125e6);
  in.world_size = 1;
  EXPECT_THROW(PlanCodecs(in), Error);
  EXPECT_THROW(Widen({CodecKind::kF16}, {1.0}, 0.1, kCandidates), Error);
}

// 400 Mbit/s: every bucket but the last hides in f32 when the plan counts on all of its
// measured hiding time; counting on half of it, the buckets ready late in backward narrow, and
// the predictions stay those of the measured times.
TEST(CodecPlan, TheChoiceCountsOnAFractionOfTheHidingTime) {
  CodecPlanInput in = Resnet50Like(50e6);
  const auto full = PlanCodecs(in);
  for (size_t b = 0; b + 1 < full.size(); ++b) EXPECT_EQ(full[b].codec, CodecKind::kF32) << b;
  in.hiding_fraction = 0.5;
  const auto half = PlanCodecs(in);
  EXPECT_EQ(half[0].codec, CodecKind::kF32);
  EXPECT_NE(half[3].codec, CodecKind::kF32);
  for (size_t b = 0; b < half.size(); ++b) {
    EXPECT_LE(dist::CodecBits(half[b].codec), dist::CodecBits(full[b].codec)) << b;
  }
  const auto predicted = ScheduleCodecs(in, Codecs(half));
  for (size_t b = 0; b < half.size(); ++b) {
    EXPECT_DOUBLE_EQ(half[b].finish_s, predicted[b].finish_s) << b;
  }
  in.hiding_fraction = 0;
  EXPECT_THROW(PlanCodecs(in), Error);
  in.hiding_fraction = 1.5;
  EXPECT_THROW(PlanCodecs(in), Error);
}

// 20 buckets of 1 MB ready every 0.1 s, on a link with 0.2 s of latency per message: in the
// narrowest everywhere each bucket is an all-reduce of its own (0.4 s of latency each, 8 s in
// all), while in f32 the middle ones join into one. The reference is the sooner end (f32's), so
// the first bucket keeps f32 even though, with every later bucket in the narrowest, its wider
// transfer would delay the queue.
TEST(CodecPlan, WhereJoinedF32EndsSoonerThanTheNarrowestF32IsTheReference) {
  CodecPlanInput in;
  for (int b = 0; b < 20; ++b) in.buckets.push_back({0.1 * b, 1e6});
  in.backward_end_s = 2.0;
  in.world_size = 2;
  in.link = LinkModel{0.2, 1e9};
  in.candidates = kCandidates;
  in.merge_f32 = true;
  in.merge_sizes = BucketSizes{25, 1, 1};
  const auto plan = PlanCodecs(in);
  EXPECT_EQ(plan[0].codec, CodecKind::kF32);
  EXPECT_LT(plan.back().finish_s, 3.0);
  in.candidates = {CodecKind::kEpgc8};
  EXPECT_GT(PlanCodecs(in).back().finish_s, 7.9);
}

// 2 ranks: four transfers on a link of 100 MB/s and 1 ms per message (2 messages each), one of
// them held 60 ms by a late rank. Least squares would put about 15 ms into the latency; the
// envelope keeps 1 ms.
TEST(CodecPlan, TheLinkFitKeepsLatencyToTheQuickestTransfer) {
  const std::vector<double> u = {1e6, 4e6, 8e6, 26e6};
  std::vector<double> y;
  for (double bytes : u) y.push_back(2e-3 + bytes / 1e8);
  y[0] += 0.06;
  const LinkModel link = FitLink(u, y, 2);
  EXPECT_NEAR(link.latency_s, 1e-3, 3e-4);
  EXPECT_NEAR(link.bytes_per_s, 1e8, 0.05e8);
  // One size only: the mean rate, and no latency left.
  const LinkModel one = FitLink({5e6, 5e6}, {0.05, 0.05}, 2);
  EXPECT_DOUBLE_EQ(one.bytes_per_s, 1e8);
  EXPECT_NEAR(one.latency_s, 0, 1e-12);
  EXPECT_EQ(FitLink({}, {}, 2).bytes_per_s, 0);
  EXPECT_THROW(FitLink({1}, {}, 2), Error);
}

TEST(CodecPlan, LinkTimeRoundsEveryProductAsACpuWithoutFusedMultiplyAdd) {
  // codec_plan.cpp is built with -ffp-contract=off (engine/CMakeLists.txt), so that the same
  // agreed numbers give the same plan on any CPU: with -march=native the compiler would fuse
  // steps * latency + bytes time into one multiply-add, which rounds once where this rounds twice.
  // On 4 ranks these numbers round differently the two ways.
  volatile double latency_part = 6.0 * 2.5e-5;  // 2 (W - 1) hops of latency, rounded
  volatile double bytes_part = 6.0 / 4 * 300000.0 / 1e9;
  const double unfused = latency_part + bytes_part;
  ASSERT_NE(unfused, std::fma(6.0, 2.5e-5, bytes_part)) << "the numbers must tell the two apart";
  EXPECT_EQ((LinkModel{2.5e-5, 1e9}.AllReduceSeconds(300000.0, 4)), unfused);
}

TEST(CodecPlan, MoreExposureThanPredictedLowersTheHidingFraction) {
  // Backward 5 s: up to 0.251 s more than predicted is noise.
  EXPECT_DOUBLE_EQ(NextHidingFraction(0.7, 0.25, 0.0, 5.0), 0.7);
  EXPECT_DOUBLE_EQ(NextHidingFraction(0.7, 0.72, 0.003, 5.0), 0.525);
  EXPECT_DOUBLE_EQ(NextHidingFraction(0.7, 1.0, 0.9, 5.0), 0.7);  // predicted, so planned for
  EXPECT_DOUBLE_EQ(NextHidingFraction(0.06, 9.0, 0.0, 5.0), 0.05);
}

// A trial side's step time (for the log) leaves out its first step when it has more.
TEST(CodecPlan, TrialStepTimeIsTheMedianAfterTheFirstStep) {
  EXPECT_DOUBLE_EQ(TrialStepSeconds({}), 0);
  EXPECT_DOUBLE_EQ(TrialStepSeconds({4.0}), 4.0);
  EXPECT_DOUBLE_EQ(TrialStepSeconds({9.0, 5.0}), 5.0);
  EXPECT_DOUBLE_EQ(TrialStepSeconds({9.0, 5.0, 6.0}), 5.5);
  EXPECT_DOUBLE_EQ(TrialStepSeconds({9.0, 5.0, 7.0, 6.0}), 6.0);
}

TEST(CodecPlan, MedianOfOddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(Median({}), 0);
  EXPECT_DOUBLE_EQ(Median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(Median({4.0, 1.0, 3.0, 2.0}), 2.5);
}

// The pace compares each narrow step with the plan's step beside it. A machine that slows down
// through the trial (every step 5% slower than the one before) would make a narrow plan 2%
// faster look slower in two blocks of steps; pair by pair it still wins.
TEST(CodecPlan, TrialPaceIsTheMedianRatioOfNeighbouringSteps) {
  EXPECT_DOUBLE_EQ(TrialPace({}, {}), 1);
  EXPECT_DOUBLE_EQ(TrialPace({5.0}, {4.0}), 0.8);
  EXPECT_DOUBLE_EQ(TrialPace({9.0, 5.0}, {2.0, 4.0}), 0.8);  // the first pair left out
  EXPECT_DOUBLE_EQ(TrialPace({9.0, 5.0, 4.0, 5.0}, {1.0, 4.5, 4.4, 4.0}), 0.9);
  EXPECT_DOUBLE_EQ(TrialPace({9.0, 5.0, 4.0}, {1.0, 4.0}), 0.8);  // whole pairs only
  std::vector<double> plan, narrow;
  double t = 5.0;
  for (int i = 0; i < 4; ++i) {
    plan.push_back(t);
    t *= 1.05;
    narrow.push_back(0.98 * t);
    t *= 1.05;
  }
  EXPECT_GT(TrialStepSeconds(narrow), TrialStepSeconds(plan));  // blocks: the plan looks faster
  EXPECT_NEAR(TrialPace(plan, narrow), 0.98 * 1.05, 1e-12);
  // A steady 2% gain.
  EXPECT_NEAR(TrialPace({5.0, 5.1, 4.9, 5.0}, {4.9, 4.998, 4.802, 4.9}), 0.98, 1e-12);
}

// The faster side stays; a tie keeps the plan's precision. ResNet-50 at 100 Mbit/s, where the
// plan's extra 12 MB slowed compute from 5.26 s to 5.66 s, keeps the narrow plan.
TEST(CodecPlan, TrialKeepsTheNarrowPlanWhenItRanFaster) {
  EXPECT_TRUE(NarrowWinsTrial(5.26 / 5.66));
  EXPECT_TRUE(NarrowWinsTrial(0.99));
  EXPECT_FALSE(NarrowWinsTrial(1.0));
  EXPECT_FALSE(NarrowWinsTrial(5.66 / 5.26));
}

// With merge_f32, neighbouring f32 buckets travel as one all-reduce that starts when the later
// one is ready: 26 + 26 MB fit one 60 MB run.
TEST(CodecPlan, MergedF32BucketsQueueAsOneTransfer) {
  CodecPlanInput in = Resnet50Like(1.25e9);
  in.merge_f32 = true;
  in.merge_sizes = BucketSizes{60, 1, 1};
  const auto plan = PlanCodecs(in);
  EXPECT_EQ(Codecs(plan), (std::vector<CodecKind>{CodecKind::kF32, CodecKind::kF32, CodecKind::kF32,
                                                  CodecKind::kF32, CodecKind::kEpgc8}));
  EXPECT_DOUBLE_EQ(plan[1].start_s, 1.6);  // bucket 2's ready time
  EXPECT_DOUBLE_EQ(plan[2].start_s, 1.6);
  EXPECT_DOUBLE_EQ(plan[1].finish_s, 1.6 + 2 * 50e-6 + 52e6 / 1.25e9);
  EXPECT_DOUBLE_EQ(plan[3].start_s, 2.3);  // alone: 26 MB more would pass 60
}

}  // namespace
}  // namespace cortado
