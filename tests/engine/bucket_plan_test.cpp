// The bucket planner alone: no net, no communicator.
#include "engine/parallel/bucket_plan.h"

#include <gtest/gtest.h>

#include "engine/base/error.h"

namespace cortado {
namespace {

using dist::CodecKind;

constexpr int64_t kMiB = 1 << 20;  // bytes

// n parameters of `floats` f32 elements each, named p0, p1, ...
std::vector<BucketedParam> Params(int n, int64_t floats, CodecKind codec = CodecKind::kF32) {
  std::vector<BucketedParam> order;
  for (int i = 0; i < n; ++i) order.push_back({"p" + std::to_string(i), floats, codec});
  return order;
}

TEST(PlanBuckets, SmallFirstAndLastBucketsAroundFullMiddleOnes) {
  // 20 parameters of 1 MiB (f32): bucket 0 passes 1 MiB with its second parameter, the last
  // bucket likewise from the end, the middle is cut at 4 MiB.
  const BucketPlan plan = PlanBuckets(Params(20, kMiB / 4), BucketSizes{4, 1, 1}, 4);
  std::vector<int> params;
  for (const GradientBucket& b : plan.buckets) params.push_back(b.params);
  EXPECT_EQ(params, (std::vector<int>{1, 4, 4, 4, 4, 2, 1}));
  EXPECT_EQ(plan.buckets.front().first, "p0");
  EXPECT_EQ(plan.buckets.back().last, "p19");
  // Contiguous, every parameter where the plan says, the control words after the last one.
  for (size_t b = 1; b < plan.buckets.size(); ++b) {
    EXPECT_EQ(plan.buckets[b].begin, plan.buckets[b - 1].end);
  }
  EXPECT_EQ(plan.control_index, 20 * kMiB / 4);
  EXPECT_EQ(plan.block_elements, plan.control_index + 2);
  EXPECT_EQ(plan.buckets.back().end, plan.block_elements);
  EXPECT_EQ(plan.bucket_of[19], plan.buckets.size() - 1);
}

TEST(PlanBuckets, EveryParameterStartsOnACacheLine) {
  std::vector<BucketedParam> order = {{"a", 3}, {"b", 17}, {"c", 1}, {"d", 100}};
  for (int64_t esize : {4, 8}) {
    const BucketPlan plan = PlanBuckets(order, BucketSizes{}, esize);
    for (size_t i = 0; i < order.size(); ++i) {
      EXPECT_EQ(plan.offset[i] * esize % 64, 0) << order[i].name;
      if (i > 0) {
        EXPECT_GE(plan.offset[i], plan.offset[i - 1] + order[i - 1].numel);
      }
    }
  }
}

TEST(PlanBuckets, ACodecChangeStartsABucket) {
  std::vector<BucketedParam> order = {{"fc.w", 1000, CodecKind::kEpgc8},
                                      {"fc.b", 10, CodecKind::kF32},
                                      {"conv2.w", 1000, CodecKind::kEpgc8},
                                      {"conv1.w", 1000, CodecKind::kEpgc8}};
  const BucketPlan plan = PlanBuckets(order, BucketSizes{25, 25, 25}, 4);
  ASSERT_GE(plan.buckets.size(), 3u);
  for (const GradientBucket& b : plan.buckets) {
    for (size_t i = 0; i < order.size(); ++i) {
      if (plan.bucket_of[i] == static_cast<size_t>(&b - plan.buckets.data())) {
        EXPECT_EQ(order[i].codec, b.codec) << order[i].name;
      }
    }
  }
  // The last parameters are compressed: the control words get an f32 bucket of their own.
  EXPECT_EQ(plan.buckets.back().codec, CodecKind::kF32);
  EXPECT_EQ(plan.buckets.back().params, 0);
  EXPECT_EQ(plan.buckets.back().first, "(control)");
  EXPECT_EQ(plan.buckets.back().end - plan.buckets.back().begin, 2);
}

TEST(PlanBuckets, OneParameterIsOneBucketWithTheControlWords) {
  const BucketPlan plan = PlanBuckets({{"w", 5}}, BucketSizes{}, 4);
  ASSERT_EQ(plan.buckets.size(), 1u);
  EXPECT_EQ(plan.buckets[0].params, 1);
  EXPECT_EQ(plan.control_index, 16);  // 5 floats, aligned up to a 64-byte line
  EXPECT_EQ(plan.block_elements, 18);
}

TEST(PlanBuckets, RefusesNonPositiveSizesAndAnEmptyNet) {
  EXPECT_THROW(PlanBuckets({{"w", 5}}, BucketSizes{0, 1, 1}, 4), Error);
  EXPECT_THROW(PlanBuckets({{"w", 5}}, BucketSizes{25, -1, 1}, 4), Error);
  try {
    PlanBuckets({}, BucketSizes{}, 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no parameters"), std::string::npos) << e.what();
  }
}

std::vector<std::pair<size_t, size_t>> Ranges(const std::vector<IssueRun>& runs) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const IssueRun& r : runs) out.emplace_back(r.begin, r.end);
  return out;
}

TEST(MergeRuns, F32NeighboursJoinByTheBucketSizes) {
  // MB: a small first run, a small last run, middle runs up to 25 MB; a bucket over its limit
  // runs alone.
  const std::vector<double> mb = {0.5, 0.3, 10, 10, 10, 30, 0.4, 0.3};
  std::vector<double> bytes;
  for (double m : mb) bytes.push_back(m * kMiB);
  const auto runs = MergeRuns(bytes, std::vector<bool>(mb.size(), true), BucketSizes{25, 1, 1});
  EXPECT_EQ(Ranges(runs),
            (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 4}, {4, 5}, {5, 6}, {6, 8}}));
}

TEST(MergeRuns, ABucketThatCannotMergeRunsAloneAndSplitsItsNeighbours) {
  const std::vector<double> bytes(7, 0.1 * kMiB);
  const std::vector<bool> mergeable = {true, true, false, true, true, false, true};
  EXPECT_EQ(Ranges(MergeRuns(bytes, mergeable, BucketSizes{25, 1, 1})),
            (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 3}, {3, 5}, {5, 6}, {6, 7}}));
  // Nothing mergeable: one run per bucket.
  EXPECT_EQ(MergeRuns(bytes, std::vector<bool>(7, false), BucketSizes{}).size(), 7u);
  // Everything fits the first run's limit: one run.
  EXPECT_EQ(Ranges(MergeRuns(bytes, std::vector<bool>(7, true), BucketSizes{25, 1, 1})),
            (std::vector<std::pair<size_t, size_t>>{{0, 7}}));
  EXPECT_TRUE(MergeRuns({}, {}, BucketSizes{}).empty());
  EXPECT_THROW(MergeRuns(bytes, {true}, BucketSizes{}), Error);
}

}  // namespace
}  // namespace cortado
