// Communicator::Split with ranks as threads of this process (an in-memory store): groups of
// consecutive ranks and interleaved groups with reversed keys for 2-5 ranks, the collectives on
// the children, nested splits, argument checks, and a child driven from one thread while the
// parent's worker runs a large all-reduce (the "priority lane" of synchronized batch norm).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include "cortado/dist/communicator.h"
#include "matrix.h"
#include "test_util.h"

namespace cortado::dist::testing {
namespace {

// Expects child to be the group `members` (world ranks, in child-rank order) and checks that an
// all-reduce and an all-gather over it see exactly them.
void ExpectGroup(Communicator& world, Communicator& child, const std::vector<int>& members,
                 const std::string& what) {
  SCOPED_TRACE(what + ", world rank " + std::to_string(world.rank()));
  ASSERT_EQ(child.size(), static_cast<int>(members.size()));
  auto me = std::find(members.begin(), members.end(), world.rank());
  ASSERT_NE(me, members.end());
  EXPECT_EQ(child.rank(), me - members.begin());
  EXPECT_STREQ(child.backend(), members.size() == 1 ? "local" : world.backend());
  float sum = static_cast<float>(world.rank()), want = 0;
  for (int m : members) want += static_cast<float>(m);
  child.AllReduce(&sum, 1, DataType::kF32, ReduceOp::kSum);
  EXPECT_EQ(sum, want);
  float mine = static_cast<float>(world.rank());
  std::vector<float> all(members.size());
  child.AllGather(&mine, all.data(), 1, DataType::kF32);
  for (size_t i = 0; i < members.size(); ++i) {
    EXPECT_EQ(all[i], static_cast<float>(members[i])) << "child rank " << i;
  }
}

class SplitThreads : public ::testing::TestWithParam<TransportRanks> {};

TEST_P(SplitThreads, ConsecutiveAndInterleavedGroupsRunEveryCollective) {
  const auto& [transport, n] = GetParam();
  CORTADO_SKIP_UNLESS_BUILT(transport);
  std::vector<std::vector<std::string>> failures(static_cast<size_t>(n));
  auto errors = RunThreads(
      n,
      [&, n = n](Communicator& world) {
        const int r = world.rank();
        auto& mine = failures[static_cast<size_t>(r)];
        auto pairs = world.Split(r / 2, r);
        std::vector<int> pair_members;
        for (int q = 0; q < n; ++q) {
          if (q / 2 == r / 2) pair_members.push_back(q);
        }
        ExpectGroup(world, *pairs, pair_members, "split(rank / 2, rank)");
        auto parity = world.Split(r % 2, -r);
        std::vector<int> parity_members;  // reversed keys: the highest world rank is rank 0
        for (int q = n - 1; q >= 0; --q) {
          if (q % 2 == r % 2) parity_members.push_back(q);
        }
        ExpectGroup(world, *parity, parity_members, "split(rank % 2, -rank)");
        for (Communicator* child : {pairs.get(), parity.get()}) {
          for (const auto& f : RunMatrix(*child, {0, 1, 17, 5003})) {
            mine.push_back("child of size " + std::to_string(child->size()) + ": " + f);
          }
        }
        // A split of a split, and every rank alone.
        auto nested = parity->Split(0, -parity->rank());
        std::vector<int> nested_members(parity_members.rbegin(), parity_members.rend());
        ExpectGroup(world, *nested, nested_members, "nested split");
        auto alone = world.Split(r, 0);
        ExpectGroup(world, *alone, {r}, "split(rank, 0)");
        // The parent is unaffected and keeps counting its own operations.
        float x = 1;
        world.AllReduce(&x, 1, DataType::kF32, ReduceOp::kSum);
        EXPECT_EQ(x, static_cast<float>(n));
      },
      OptionsFor(transport));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    for (const auto& f : failures[static_cast<size_t>(r)]) ADD_FAILURE() << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, SplitThreads,
                         ::testing::Combine(::testing::ValuesIn(TransportNames()),
                                            ::testing::Values(2, 3, 4, 5)),
                         TransportRanksName);

// The priority lane: on every rank the parent's worker all-reduces 16 MB while another thread
// runs many small all-reduces on a child. Both must be right, and the child's must not wait for
// the parent's queue (they share no lock, connection or thread).
TEST(SplitThreadsConcurrency, ChildRunsBesideTheParentsWorker) {
  const int n = 4;
  constexpr int kSmall = 300;
  std::atomic<int> during{0};
  auto errors = RunThreads(n, [&](Communicator& world) {
    const int r = world.rank();
    auto lane = world.Split(0, r);
    std::vector<float> big(4 << 20), big2(4 << 20);
    for (size_t i = 0; i < big.size(); ++i) {
      big[i] = static_cast<float>((i + static_cast<size_t>(r)) % 13);
      big2[i] = static_cast<float>(r);
    }
    auto work = world.AllReduceAsync(big.data(), big.size(), DataType::kF32, ReduceOp::kSum);
    auto work2 = world.AllReduceAsync(big2.data(), big2.size(), DataType::kF32, ReduceOp::kMax);
    std::string lane_error;
    std::thread side([&] {
      try {
        for (int i = 0; i < kSmall; ++i) {
          float v[3] = {1.0f, static_cast<float>(r), static_cast<float>(i)};
          lane->AllReduce(v, 3, DataType::kF32, ReduceOp::kSum);
          if (v[0] != static_cast<float>(n) || v[1] != static_cast<float>(n * (n - 1) / 2) ||
              v[2] != static_cast<float>(i * n)) {
            lane_error = "lane all-reduce " + std::to_string(i) + " wrong";
            return;
          }
          double d = r + 0.5;
          lane->AllReduce(&d, 1, DataType::kF64, ReduceOp::kAvg);
          if (d != (n - 1) / 2.0 + 0.5) {
            lane_error = "lane f64 average " + std::to_string(i) + " wrong";
            return;
          }
          if (!work2->Test()) ++during;
        }
      } catch (const std::exception& e) {
        lane_error = e.what();
      }
    });
    work->Wait();
    work2->Wait();
    side.join();
    EXPECT_EQ(lane_error, "");
    for (size_t i = 0; i < big.size(); ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += static_cast<float>((i + static_cast<size_t>(q)) % 13);
      if (big[i] != want) {
        ADD_FAILURE() << "parent all-reduce wrong at " << i << ": " << big[i] << " != " << want;
        break;
      }
    }
    EXPECT_TRUE(std::all_of(big2.begin(), big2.end(),
                            [&](float v) { return v == static_cast<float>(n - 1); }));
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  // Informational: how many lane steps (over all ranks) finished while the parent's worker was
  // still busy. Zero would mean the lane queued behind it - or a very fast parent.
  std::printf("lane steps during the parent's all-reduces: %d of %d\n", during.load(), n * kSmall);
}

TEST(SplitThreadsApi, NegativeColorIsRejectedBeforeCommunicating) {
  auto errors = RunThreads(2, [](Communicator& world) {
    try {
      world.Split(-1, 0);
      ADD_FAILURE() << "color -1 accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_EQ(e.op(), "split");
      EXPECT_NE(std::string(e.what()).find("color -1"), std::string::npos) << e.what();
    }
    auto child = world.Split(0, 0);  // both still agree on the order of operations
    float x = 1;
    child->AllReduce(&x, 1, DataType::kF32, ReduceOp::kSum);
    EXPECT_EQ(x, 2.0f);
  });
  EXPECT_EQ(errors[0] + errors[1], "");
}

TEST(SplitThreadsApi, SplitWaitsForQueuedWorkAndChildOutlivesParent) {
  std::vector<std::unique_ptr<Communicator>> children(3);
  std::vector<std::vector<float>> bufs(3, std::vector<float>(1 << 18, 1.0f));
  auto errors = RunThreads(3, [&](Communicator& world) {
    auto& buf = bufs[static_cast<size_t>(world.rank())];
    auto work = world.AllReduceAsync(buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum);
    auto child = world.Split(0, world.rank());
    EXPECT_TRUE(work->Test()) << "Split ran before the queued all-reduce";
    children[static_cast<size_t>(world.rank())] = std::move(child);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  for (const auto& buf : bufs) EXPECT_EQ(buf[12345], 3.0f);
  // The parents are gone (RunThreads destroyed them); the children still work.
  std::vector<std::thread> threads;
  std::vector<float> got(3, 0);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      float v = static_cast<float>(r);
      children[static_cast<size_t>(r)]->AllReduce(&v, 1, DataType::kF32, ReduceOp::kMax);
      got[static_cast<size_t>(r)] = v;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got, std::vector<float>(3, 2.0f));
}

TEST(SplitThreadsApi, LocalCommunicatorSplitsIntoLocal) {
  CommConfig config;  // rank 0 of 1
  auto world = CreateCommunicator(config);
  auto child = world->Split(7, -3);
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->rank(), 0);
  EXPECT_STREQ(child->backend(), "local");
  double v[2] = {1.5, 2.5};
  child->AllReduce(v, 2, DataType::kF64, ReduceOp::kAvg);
  EXPECT_EQ(v[1], 2.5);
  auto grandchild = child->Split(0, 0);
  EXPECT_EQ(grandchild->size(), 1);
  EXPECT_THROW(world->Split(-2, 0), Error);
}

}  // namespace
}  // namespace cortado::dist::testing
