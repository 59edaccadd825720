// Ranks as separate processes over each transport (the dist_test_worker helper, rendezvous through
// rank 0's TCP store): the collective matrix for 1-5 ranks, Split, a rank killed during a 64 MB
// all-reduce (an ordinary rank and rank 0, the store's host), and a stalled rank (also on a
// split child); the UCX transport's eager-send choice as rank 0 logs it, and the ranks' choices
// where they differ.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <regex>
#include <string>

#include "test_util.h"

namespace cortado::dist::testing {
namespace {

// The integer after `key=`, on the first line that starts with `line` (any line when empty).
long long Field(const std::string& text, const std::string& key, const std::string& line = "") {
  std::smatch m;
  std::regex re((line.empty() ? std::string() : "(^|\n)" + line + "[^\n]*") + "\\b" + key +
                "=(-?[0-9]+)");
  if (!std::regex_search(text, m, re)) return -1;
  return std::stoll(m[m.size() - 1]);
}

std::string Describe(const std::vector<ProcessResult>& results) {
  std::string out;
  for (size_t r = 0; r < results.size(); ++r) {
    out += "--- rank " + std::to_string(r) + " (exit " + std::to_string(results[r].code) + ")\n" +
           results[r].output;
  }
  return out;
}

class CollectivesProcesses : public ::testing::TestWithParam<TransportRanks> {};

TEST_P(CollectivesProcesses, EveryCollectiveAlgorithmTypeAndCount) {
  const auto& [transport, n] = GetParam();
  CORTADO_SKIP_UNLESS_BUILT(transport);
  auto results = RunProcesses(n, {"matrix"}, {{"CORTADO_TRANSPORT", transport}}, 120);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(results[static_cast<size_t>(r)].code, 0) << Describe(results);
    EXPECT_NE(results[static_cast<size_t>(r)].output.find("MATRIX OK"), std::string::npos)
        << Describe(results);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesProcesses,
                         ::testing::Combine(::testing::ValuesIn(TransportNames()),
                                            ::testing::Values(1, 2, 3, 4, 5)),
                         TransportRanksName);

// Split over the TCP store: rank 0 serves it, the others reach it with clients of their own for
// each child's rendezvous; the matrix on both children, a nested split and the priority lane.
class SplitProcesses : public ::testing::TestWithParam<TransportRanks> {};

TEST_P(SplitProcesses, ChildrenRendezvousThroughTheJobsStore) {
  const auto& [transport, n] = GetParam();
  CORTADO_SKIP_UNLESS_BUILT(transport);
  auto results = RunProcesses(n, {"split", "0,1,17,5003"}, {{"CORTADO_TRANSPORT", transport}}, 120);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(results[static_cast<size_t>(r)].code, 0) << Describe(results);
    EXPECT_NE(results[static_cast<size_t>(r)].output.find("SPLIT OK"), std::string::npos)
        << Describe(results);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, SplitProcesses,
                         ::testing::Combine(::testing::ValuesIn(TransportNames()),
                                            ::testing::Values(1, 2, 3, 5)),
                         TransportRanksName);

// 5 ranks, one killed during a 64 MB all-reduce: every survivor fails within 5 s, naming the
// dead rank and the all-reduce. With registered memory over UCX the all-reduces run 'direct',
// which takes a few milliseconds: the victim's may finish before it dies, and the survivors
// are then waiting for it in the next one (its descriptor never comes).
void ExpectSurvivorsBlame(const std::string& transport, int victim, bool registered = false) {
  const int n = 5;
  std::vector<std::string> args = {"kill", std::to_string(victim), std::to_string(64 << 20)};
  if (registered) args.push_back("registered");
  auto results =
      RunProcesses(n, args, {{"CORTADO_TIMEOUT_S", "60"}, {"CORTADO_TRANSPORT", transport}}, 60);
  const std::string all = Describe(results);
  long long killed_at = Field(results[static_cast<size_t>(victim)].output, "t_us", "KILL");
  ASSERT_GT(killed_at, 0) << all;
  EXPECT_EQ(results[static_cast<size_t>(victim)].code, 128 + 9) << all;
  const std::string algo =
      registered && SharesMemoryInThisBuild(transport) ? "ALGO direct" : "ALGO ring";
  EXPECT_NE(results[static_cast<size_t>(victim)].output.find(algo), std::string::npos) << all;
  if (!registered) {
    EXPECT_NE(results[static_cast<size_t>(victim)].output.find("done=0"), std::string::npos)
        << "the all-reduce had finished before the kill; the test did not test anything\n"
        << all;
  }
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const std::string& out = results[static_cast<size_t>(r)].output;
    EXPECT_EQ(results[static_cast<size_t>(r)].code, 3) << "rank " << r << "\n" << all;
    EXPECT_EQ(Field(out, "peer", "ERROR"), victim) << "rank " << r << "\n" << all;
    EXPECT_NE(out.find("op=allreduce"), std::string::npos) << "rank " << r << "\n" << all;
    EXPECT_NE(out.find("rank " + std::to_string(victim)), std::string::npos) << all;
    long long failed_at = Field(out, "t_us", "ERROR");
    EXPECT_GT(failed_at, 0) << all;
    EXPECT_LT(failed_at - killed_at, 5'000'000) << "rank " << r << " took too long\n" << all;
  }
}

// Every failure test runs over each transport.
class RankFailure : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { CORTADO_SKIP_UNLESS_BUILT(GetParam()); }
};

TEST_P(RankFailure, RankKilledDuringAllReduceIsNamedByEveryRank) {
  ExpectSurvivorsBlame(GetParam(), 2);
}

TEST_P(RankFailure, StoreHostKilledDuringAllReduceIsNamedByEveryRank) {
  ExpectSurvivorsBlame(GetParam(), 0);
}

TEST_P(RankFailure, RankKilledDuringAllReducesOfRegisteredMemoryIsNamedByEveryRank) {
  ExpectSurvivorsBlame(GetParam(), 3, /*registered=*/true);
}

// A rank that does not arrive: the others fail at the 2 s deadline naming it; it fails at once
// when it finally arrives instead of hanging.
TEST_P(RankFailure, StalledRankIsNamedAtTheDeadline) {
  const int n = 3, sleeper = 1;
  auto results = RunProcesses(n, {"stall", std::to_string(sleeper), "3500"},
                              {{"CORTADO_TIMEOUT_S", "2"}, {"CORTADO_TRANSPORT", GetParam()}}, 30);
  const std::string all = Describe(results);
  for (int r = 0; r < n; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].output;
    EXPECT_EQ(results[static_cast<size_t>(r)].code, 3) << all;
    long long entered = Field(out, "t_us", "ENTER"), failed = Field(out, "t_us", "ERROR");
    ASSERT_GT(entered, 0) << all;
    EXPECT_NE(out.find("op=allreduce"), std::string::npos) << all;
    if (r == sleeper) {
      EXPECT_LT(failed - entered, 1'000'000) << "the late rank should fail at once\n" << all;
      continue;
    }
    EXPECT_EQ(Field(out, "peer", "ERROR"), sleeper) << all;
    EXPECT_NE(out.find("did not arrive"), std::string::npos) << all;
    EXPECT_NE(out.find("rank(s) 1 "), std::string::npos) << all;
    EXPECT_GE(failed - entered, 1'900'000) << all;
    EXPECT_LT(failed - entered, 4'000'000) << all;
  }
}

// The same on a child of world->Split(0, -rank): world rank 0 (the store's host) sleeps, which
// is child rank 2 of 3; the others must name child rank 2.
TEST_P(RankFailure, StalledRankOfASplitChildIsNamedAtTheDeadline) {
  const int n = 3, sleeper = 0, late = n - 1 - sleeper;
  auto results = RunProcesses(n, {"split_stall", std::to_string(sleeper), "3500"},
                              {{"CORTADO_TIMEOUT_S", "2"}, {"CORTADO_TRANSPORT", GetParam()}}, 30);
  const std::string all = Describe(results);
  for (int r = 0; r < n; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].output;
    EXPECT_EQ(results[static_cast<size_t>(r)].code, 3) << all;
    EXPECT_NE(out.find("op=allreduce"), std::string::npos) << all;
    if (r == sleeper) continue;
    EXPECT_EQ(Field(out, "peer", "ERROR"), late) << all;
    // A rank whose own deadline fires lists the late rank in Error::ranks(); one that hears of
    // the failure from a peer first (whose deadline fired a moment earlier, as happens on a
    // loaded machine) gets that peer's message, which names the late rank too.
    if (out.find("as reported by rank") == std::string::npos) {
      EXPECT_EQ(Field(out, "ranks", "ERROR"), late) << all;
    }
    EXPECT_NE(out.find("allreduce #2 "), std::string::npos) << all;
    EXPECT_NE(out.find("rank(s) 2 did not arrive"), std::string::npos) << all;
  }
}

INSTANTIATE_TEST_SUITE_P(Each, RankFailure, ::testing::ValuesIn(TransportNames()), TransportName);

// The UCX transport's choice between eager sends and rendezvous (transport/ucx/eager_policy.h)
// end to end over 2 processes: rank 0 says once what it chose and why, rank 1 says nothing, and
// the collectives pass (with a 1.2 MB all-reduce, sent eagerly where forced).
TEST(UcxEagerSends, RankZeroSaysWhatTheTransportChose) {
  CORTADO_SKIP_UNLESS_BUILT(std::string("ucx"));
  if (std::getenv("UCX_RNDV_THRESH")) GTEST_SKIP() << "UCX_RNDV_THRESH is set around the test";
  struct Case {
    std::map<std::string, std::string> env;
    std::string says;
  };
  const std::string prefix = "cortado: ucx transport: ";
  const Case cases[] = {
      // No shared memory allowed: the ranks meet over TCP even on one host.
      {{{"UCX_TLS", "tcp,self"}},
       "UCX_TLS=tcp,self allows no shared memory); eager sends for every size (set "
       "UCX_RNDV_THRESH to choose otherwise)"},
      {{{"UCX_TLS", "tcp,self"}, {"UCX_RNDV_THRESH", "8k"}},
       "UCX_RNDV_THRESH=8k is set; the rendezvous threshold is left as it says"},
      // One host (the host names the ranks exchanged agree) with shared memory: UCX's default.
      {{{"UCX_TLS", "sm,tcp,self"}}, "every rank on one host, and UCX_TLS=sm,tcp,self allows"},
  };
  for (const Case& c : cases) {
    std::map<std::string, std::string> env = c.env;
    env["CORTADO_TRANSPORT"] = "ucx";
    env["UCX_NET_DEVICES"] = "lo";
    auto results = RunProcesses(2, {"matrix", "0,1,17,300000"}, env, 120);
    const std::string all = Describe(results);
    for (const auto& r : results) {
      EXPECT_EQ(r.code, 0) << all;
      EXPECT_NE(r.output.find("MATRIX OK"), std::string::npos) << all;
    }
    const std::string& out0 = results[0].output;
    const size_t at = out0.find(prefix);
    ASSERT_NE(at, std::string::npos) << all;
    EXPECT_EQ(out0.find(prefix, at + 1), std::string::npos) << "logged twice\n" << all;
    EXPECT_EQ(out0.find("chose differently"), std::string::npos) << all;
    EXPECT_NE(out0.find(c.says, at), std::string::npos) << all;
    EXPECT_EQ(results[1].output.find(prefix), std::string::npos) << all;
  }
}

// Each rank chooses from its own environment, and the choices travel in the transport addresses:
// with UCX_RNDV_THRESH set for rank 1 only, rank 0 (eager: tcp only) names both choices once,
// rank 1 says nothing, and the collectives pass.
TEST(UcxEagerSends, RankZeroNamesTheRanksWhenTheyChoseDifferently) {
  CORTADO_SKIP_UNLESS_BUILT(std::string("ucx"));
  if (std::getenv("UCX_RNDV_THRESH")) GTEST_SKIP() << "UCX_RNDV_THRESH is set around the test";
  const std::string line =
      "cortado: ucx transport: the ranks chose differently between eager sends and rendezvous: "
      "rank(s) 0 force eager sends for every size (peers reachable only over TCP); rank(s) 1 use "
      "the UCX_RNDV_THRESH set for them";
  auto results = RunProcesses(
      2, {"matrix", "0,1,17,300000"},
      {{"CORTADO_TRANSPORT", "ucx"}, {"UCX_NET_DEVICES", "lo"}, {"UCX_TLS", "tcp,self"}}, 120,
      [](int rank) {
        std::map<std::string, std::string> env;
        if (rank == 1) env["UCX_RNDV_THRESH"] = "8k";
        return env;
      });
  const std::string all = Describe(results);
  for (const auto& r : results) {
    EXPECT_EQ(r.code, 0) << all;
    EXPECT_NE(r.output.find("MATRIX OK"), std::string::npos) << all;
  }
  const std::string& out0 = results[0].output;
  const size_t at = out0.find(line);
  ASSERT_NE(at, std::string::npos) << all;
  EXPECT_EQ(out0.find("chose differently", at + line.size()), std::string::npos) << "logged twice\n"
                                                                                 << all;
  EXPECT_EQ(results[1].output.find("chose differently"), std::string::npos) << all;
}

TEST(Rendezvous, MismatchedWorldSizeFailsEveryRankClearly) {
  auto results =
      RunProcesses(2, {"matrix", "1"}, {{"CORTADO_CONNECT_TIMEOUT_S", "20"}}, 30, [](int rank) {
        std::map<std::string, std::string> env;
        if (rank == 1) env["CORTADO_WORLD_SIZE"] = "3";
        return env;
      });
  const std::string all = Describe(results);
  for (const auto& r : results) {
    EXPECT_EQ(r.code, 3) << all;
    EXPECT_NE(r.output.find("world size mismatch: rank 1 says 3, rank 0 says 2"), std::string::npos)
        << all;
  }
}

}  // namespace
}  // namespace cortado::dist::testing
