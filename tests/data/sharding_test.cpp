// EpochSharder: every epoch, ranks take disjoint, equal-sized shards that together cover the
// dataset (drop_last: all but a tail shorter than one global batch; padding: all of it, with
// the order wrapping around), in an order that is a function of (seed, epoch) only.
#include "data/sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace cortado {
namespace {

std::vector<std::vector<int64_t>> AllRanks(int64_t n, int64_t batch, int world, bool shuffle,
                                           bool drop_last, uint64_t seed, int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world; ++r) {
    EpochSharder s(n, batch, ShardSpec{r, world}, shuffle, drop_last, seed);
    out.push_back(s.RankOrder(epoch));
    EXPECT_EQ(static_cast<int64_t>(out.back().size()), s.samples_per_epoch());
    EXPECT_EQ(s.samples_per_epoch(), s.batches_per_epoch() * batch);
  }
  return out;
}

TEST(Sharding, DropLastIsDisjointEqualAndCoversAllButTheTail) {
  for (int world : {1, 2, 3, 4, 5}) {
    for (int64_t n : {int64_t{60}, int64_t{61}, int64_t{97}, int64_t{1000}}) {
      const int64_t batch = 4;
      auto ranks = AllRanks(n, batch, world, true, true, 7, 3);
      std::set<int64_t> seen;
      for (const auto& order : ranks) {
        EXPECT_EQ(order.size(), ranks[0].size()) << "world " << world << " n " << n;
        for (int64_t i : order) {
          EXPECT_GE(i, 0);
          EXPECT_LT(i, n);
          EXPECT_TRUE(seen.insert(i).second) << "index " << i << " on two ranks";
        }
      }
      const int64_t global = batch * world;
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n / global * global);
      EXPECT_LT(n - static_cast<int64_t>(seen.size()), global);  // only the tail is dropped
    }
  }
}

TEST(Sharding, PaddingCoversEverythingWithEqualShards) {
  for (int world : {1, 2, 3, 5}) {
    for (int64_t n : {int64_t{10}, int64_t{61}, int64_t{97}}) {
      const int64_t batch = 4;
      auto ranks = AllRanks(n, batch, world, true, false, 11, 0);
      std::set<int64_t> seen;
      int64_t total = 0;
      for (const auto& order : ranks) {
        EXPECT_EQ(order.size(), ranks[0].size());
        seen.insert(order.begin(), order.end());
        total += static_cast<int64_t>(order.size());
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "every sample is seen";
      const int64_t global = batch * world;
      EXPECT_EQ(total, (n + global - 1) / global * global);
      EXPECT_LT(total - n, global) << "padding is less than one global batch";
    }
  }
}

TEST(Sharding, DeterministicPerSeedAndEpoch) {
  auto a = AllRanks(500, 8, 3, true, true, 42, 5);
  auto b = AllRanks(500, 8, 3, true, true, 42, 5);
  EXPECT_EQ(a, b);
  auto other_epoch = AllRanks(500, 8, 3, true, true, 42, 6);
  auto other_seed = AllRanks(500, 8, 3, true, true, 43, 5);
  EXPECT_NE(a, other_epoch);
  EXPECT_NE(a, other_seed);
  // The shared permutation really is shared: rank r's k-th sample is position r + k*W.
  EpochSharder one(500, 24, ShardSpec{0, 1}, true, true, 42);
  std::vector<int64_t> perm = one.RankOrder(5);
  for (int r = 0; r < 3; ++r) {
    for (size_t k = 0; k < a[r].size(); ++k) EXPECT_EQ(a[r][k], perm[r + 3 * k]);
  }
}

TEST(Sharding, NoShuffleKeepsFileOrder) {
  EpochSharder s(10, 2, ShardSpec{1, 2}, false, true, 1);
  EXPECT_EQ(s.RankOrder(0), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(s.RankOrder(9), s.RankOrder(0));
}

TEST(Sharding, RejectsDatasetSmallerThanAGlobalBatch) {
  EXPECT_THROW(EpochSharder(5, 4, ShardSpec{0, 2}, true, true, 1), Error);
  EXPECT_NO_THROW(EpochSharder(5, 4, ShardSpec{0, 2}, true, false, 1));
  EXPECT_THROW(EpochSharder(10, 2, ShardSpec{2, 2}, true, true, 1), Error);
}

}  // namespace
}  // namespace cortado
