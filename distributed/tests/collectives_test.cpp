// Every collective and algorithm, for 1 to 5 ranks running as threads of this process over each
// transport (loopback TCP; UCX where built), an in-memory store for the rendezvous, on counts
// 0, 1, odd and large.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "cortado/dist/communicator.h"
#include "matrix.h"
#include "test_util.h"

namespace cortado::dist::testing {
namespace {

class CollectivesThreads : public ::testing::TestWithParam<TransportRanks> {};

TEST_P(CollectivesThreads, EveryCollectiveAlgorithmTypeAndCount) {
  const auto& [transport, n] = GetParam();
  CORTADO_SKIP_UNLESS_BUILT(transport);
  std::vector<std::vector<std::string>> failures(static_cast<size_t>(n));
  auto errors = RunThreads(
      n,
      [&](Communicator& comm) {
        failures[static_cast<size_t>(comm.rank())] = RunMatrix(comm, DefaultCounts());
        if (n > 1) {
          EXPECT_EQ(comm.backend(), transport);
        }
      },
      OptionsFor(transport));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    for (const auto& f : failures[static_cast<size_t>(r)]) ADD_FAILURE() << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesThreads,
                         ::testing::Combine(::testing::ValuesIn(TransportNames()),
                                            ::testing::Values(1, 2, 3, 4, 5)),
                         TransportRanksName);

// Small chunks make even modest buffers run many pipeline chunk-steps per segment.
class CollectivesThreadsTuning : public ::testing::TestWithParam<std::string> {};

TEST_P(CollectivesThreadsTuning, SmallChunksAndDeepPipelines) {
  CORTADO_SKIP_UNLESS_BUILT(GetParam());
  CommOptions options = OptionsFor(GetParam());
  options.chunk_bytes = 4096;
  options.pipeline_depth = 5;
  std::vector<std::vector<std::string>> failures(3);
  auto errors = RunThreads(
      3,
      [&](Communicator& comm) {
        failures[static_cast<size_t>(comm.rank())] = RunMatrix(comm, {4099, 70001});
      },
      options);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    for (const auto& f : failures[static_cast<size_t>(r)]) ADD_FAILURE() << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Each, CollectivesThreadsTuning, ::testing::ValuesIn(TransportNames()),
                         TransportName);

TEST(CollectivesThreadsApi, AutoAlgorithmFollowsSizeAndOptions) {
  auto errors = RunThreads(2, [](Communicator& comm) {
    EXPECT_EQ(comm.AllReduceAlgorithmFor(4096), "halving_doubling");
    EXPECT_EQ(comm.AllReduceAlgorithmFor(64 << 20), "ring");
    EXPECT_EQ(comm.AllReduceAlgorithmFor(4096, Algorithm::kRing), "ring");
    EXPECT_EQ(comm.BroadcastAlgorithmFor(1024), "tree");
    EXPECT_EQ(comm.BroadcastAlgorithmFor(64 << 20), "ring");
    EXPECT_STREQ(comm.backend(), "tcp");
  });
  EXPECT_EQ(errors[0] + errors[1], "");
}

TEST(CollectivesThreadsApi, BadArgumentsAreRejectedBeforeCommunicating) {
  auto errors = RunThreads(2, [](Communicator& comm) {
    float x = 1;
    try {
      comm.Broadcast(&x, 1, DataType::kF32, 7);
      ADD_FAILURE() << "root 7 accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("root 7"), std::string::npos) << e.what();
    }
    try {
      comm.AllReduce(nullptr, 3, DataType::kF32, ReduceOp::kSum);
      ADD_FAILURE() << "null buffer accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    }
    // The communicator still works afterwards.
    comm.AllReduce(&x, 1, DataType::kF32, ReduceOp::kSum);
    EXPECT_EQ(x, 2.0f);
  });
  EXPECT_EQ(errors[0] + errors[1], "");
}

// Work records when it was queued, started by the worker and finished, for traces.
TEST(CollectivesThreadsApi, WorkRecordsQueuedStartedAndFinishedTimes) {
  using Clock = std::chrono::steady_clock;
  auto errors = RunThreads(2, [](Communicator& comm) {
    std::vector<float> big(1 << 22, 1.0f), small(16, 1.0f);
    const Clock::time_point before = Clock::now();
    auto first = comm.AllReduceAsync(big.data(), big.size(), DataType::kF32, ReduceOp::kSum);
    auto second = comm.AllReduceAsync(small.data(), small.size(), DataType::kF32, ReduceOp::kSum);
    const Clock::time_point queued = Clock::now();
    EXPECT_LE(before, first->queued_at());
    EXPECT_LE(first->queued_at(), second->queued_at());
    EXPECT_LE(second->queued_at(), queued);
    second->Wait();
    ASSERT_TRUE(first->Test());  // in issue order
    const Clock::time_point after = Clock::now();
    EXPECT_LE(first->queued_at(), first->started_at());
    EXPECT_LT(first->started_at(), first->finished_at());   // 16 MB takes a while
    EXPECT_LE(first->finished_at(), second->started_at());  // it waited behind the first
    EXPECT_LE(second->started_at(), second->finished_at());
    EXPECT_LE(second->finished_at(), after);
    EXPECT_EQ(big[7], 2.0f);
    // A failed operation is timed too: a world of one has nothing to fail, so use a buffer
    // the all-gather rejects only once it runs (input overlapping the output elsewhere).
    std::vector<float> out(2 * 4);
    auto bad = comm.AllGatherAsync(out.data() + 1, out.data(), 4, DataType::kF32);
    EXPECT_THROW(bad->Wait(), Error);
    EXPECT_LE(bad->queued_at(), bad->started_at());
    EXPECT_LE(bad->started_at(), bad->finished_at());
  });
  EXPECT_EQ(errors[0] + errors[1], "");
}

// The calling thread's CPU clock advances while it computes and not while it sleeps, and the
// kernel's user/system split adds up to it.
TEST(ThreadCpuTime, CountsComputingNotSleeping) {
  const ThreadCpu a = CurrentThreadCpu();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const ThreadCpu b = CurrentThreadCpu();
  EXPECT_LT(b.total_s - a.total_s, 0.02);
  volatile double x = 1;
  while (CurrentThreadCpu().total_s - b.total_s < 0.05) {
    for (int i = 0; i < 100000; ++i) x = x * 1.0000001 + 1e-9;
  }
  const ThreadCpu c = CurrentThreadCpu();
  EXPECT_GE(c.total_s - b.total_s, 0.05);
  EXPECT_GT(c.user_s - b.user_s, c.system_s - b.system_s);  // the loop runs in user space
  EXPECT_NEAR(c.user_s + c.system_s, c.total_s, 0.01 + 0.05 * c.total_s);
}

// Work reports the worker thread's CPU time for the operation and how often it slept waiting
// for the network. Rank 1 arrives 300 ms late: rank 0 waits that long, asleep (a few wake-ups,
// a little CPU), not polling (300 ms of CPU).
class WorkCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(WorkCpu, WaitingForALatePeerCostsLittleCpu) {
  CORTADO_SKIP_UNLESS_BUILT(GetParam());
  auto errors = RunThreads(
      2,
      [](Communicator& comm) {
        std::vector<float> data(1 << 20, 1.0f);  // 4 MB: the ring
        if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        auto w = comm.AllReduceAsync(data.data(), data.size(), DataType::kF32, ReduceOp::kSum);
        w->Wait();
        EXPECT_EQ(data[12345], 2.0f);
        const ThreadCpu cpu = w->cpu();
        const double wall =
            std::chrono::duration<double>(w->finished_at() - w->started_at()).count();
        EXPECT_GT(cpu.total_s, 0.0);  // the reduction and the system calls cost something
        EXPECT_LE(cpu.total_s, wall + 0.002);
        EXPECT_GE(cpu.user_s, 0.0);
        EXPECT_GE(cpu.system_s, 0.0);
        if (comm.rank() == 0) {
          EXPECT_GT(wall, 0.25);
          EXPECT_LT(cpu.total_s, 0.1) << "waiting for rank 1 burnt CPU";
          EXPECT_GE(w->wakeups(), 1u);
        }
      },
      OptionsFor(GetParam()));
  EXPECT_EQ(errors[0] + errors[1], "");
}

INSTANTIATE_TEST_SUITE_P(Each, WorkCpu, ::testing::ValuesIn(TransportNames()), TransportName);

// Registered memory: over UCX on one host the ranks share it and a ring-sized all-reduce of it
// runs 'direct'; over TCP (no shared memory) it is registered but runs the ring, and forcing
// 'direct' there is refused on every rank before anything is sent. A plain buffer never runs
// direct, even where the ranks could. Buffers may be freed after the communicator.
class RegisteredMemoryThreads : public ::testing::TestWithParam<std::string> {};

TEST_P(RegisteredMemoryThreads, DirectWhereRanksShareMemoryRingElsewhere) {
  const std::string transport = GetParam();
  CORTADO_SKIP_UNLESS_BUILT(transport);
  const bool shares = SharesMemoryInThisBuild(transport);
  std::vector<std::unique_ptr<RegisteredMemory>> survivors(3);
  auto errors = RunThreads(
      3,
      [&](Communicator& comm) {
        const size_t count = (1 << 20) + 5;  // 4 MB of f32: a ring-sized message
        auto memory = comm.AllocateRegistered(count * 4);
        ASSERT_GE(memory->size(), count * 4);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(memory->data()) % 4096, 0u);
        auto* reg = static_cast<float*>(memory->data());
        std::vector<float> plain(count);
        for (size_t i = 0; i < count; ++i) reg[i] = plain[i] = static_cast<float>(comm.rank());
        EXPECT_EQ(comm.AllReduceAlgorithmFor(count * 4, Algorithm::kAuto, reg),
                  shares ? "direct" : "ring");
        EXPECT_EQ(comm.AllReduceAlgorithmFor(count * 4, Algorithm::kAuto, plain.data()), "ring");
        EXPECT_EQ(comm.AllReduceAlgorithmFor(count * 4, Algorithm::kRing, reg), "ring");
        EXPECT_EQ(comm.AllReduceAlgorithmFor(4096, Algorithm::kAuto, reg), "halving_doubling");
        comm.AllReduce(reg, count, DataType::kF32, ReduceOp::kSum);
        comm.AllReduce(plain.data(), count, DataType::kF32, ReduceOp::kSum);
        EXPECT_EQ(reg[0], 3.0f);
        EXPECT_EQ(reg[count - 1], 3.0f);
        EXPECT_EQ(plain[count / 2], 3.0f);
        if (!shares) {
          try {
            comm.AllReduce(reg, count, DataType::kF32, ReduceOp::kSum, Algorithm::kDirect);
            ADD_FAILURE() << "'direct' accepted over " << comm.backend();
          } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
            EXPECT_NE(std::string(e.what()).find("share"), std::string::npos) << e.what();
          }
        } else {
          // Forced onto a plain buffer, every rank names the first rank whose buffer it is.
          try {
            comm.AllReduce(plain.data(), count, DataType::kF32, ReduceOp::kSum, Algorithm::kDirect);
            ADD_FAILURE() << "'direct' accepted on plain memory";
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("rank 0's buffer is not in memory"),
                      std::string::npos)
                << e.what();
          }
          return;  // the failed operation broke the communicator
        }
        comm.AllReduce(reg, count, DataType::kF32, ReduceOp::kSum);  // still usable
        EXPECT_EQ(reg[1], 9.0f);
        survivors[static_cast<size_t>(comm.rank())] = std::move(memory);
      },
      OptionsFor(transport));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  survivors.clear();  // freed after their communicators
}

INSTANTIATE_TEST_SUITE_P(Each, RegisteredMemoryThreads, ::testing::ValuesIn(TransportNames()),
                         TransportName);

TEST(CollectivesThreadsApi, DirectIsAnAllReduceAlgorithmOnly) {
  EXPECT_EQ(ParseAlgorithm("direct"), Algorithm::kDirect);
  auto errors = RunThreads(2, [](Communicator& comm) {
    float x = 1;
    EXPECT_THROW(comm.Broadcast(&x, 1, DataType::kF32, 0, Algorithm::kDirect), Error);
    comm.Broadcast(&x, 1, DataType::kF32, 0);
  });
  EXPECT_EQ(errors[0] + errors[1], "");
}

TEST(CollectivesThreadsApi, LocalWorldNeedsNoRendezvous) {
  CommConfig config;  // rank 0 of 1, no store, no token
  auto comm = CreateCommunicator(config);
  float v[3] = {1, 2, 3};
  comm->AllReduce(v, 3, DataType::kF32, ReduceOp::kAvg);
  EXPECT_EQ(v[2], 3.0f);
  float out[3];
  comm->AllGather(v, out, 3, DataType::kF32);
  EXPECT_EQ(out[1], 2.0f);
  comm->Barrier();
  EXPECT_STREQ(comm->backend(), "local");
  auto memory = comm->AllocateRegistered(100);  // plain memory: nothing to register with
  ASSERT_NE(memory->data(), nullptr);
  static_cast<float*>(memory->data())[0] = 5;
  comm->AllReduce(memory->data(), 1, DataType::kF32, ReduceOp::kSum);
  EXPECT_EQ(static_cast<float*>(memory->data())[0], 5.0f);
}

}  // namespace
}  // namespace cortado::dist::testing
