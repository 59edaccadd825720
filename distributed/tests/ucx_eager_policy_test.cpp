// The UCX transport's choice between eager sends and UCX's rendezvous (transport/ucx/
// eager_policy.h), as a table: the user's UCX_RNDV_THRESH, UCX_TLS (lists, aliases and '^'
// exclusions), the host's RDMA devices and whether every rank is on one host (needs no UCX); the
// line rank 0 logs when the ranks chose differently; and the hosts the communicator gathers for
// the UCX transport before it exists, which are the ones its transport address carries.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cortado/dist/communicator.h"
#include "cortado/dist/ucx_transport.h"
#include "test_util.h"
#include "transport/ucx/eager_policy.h"

namespace cortado::dist::ucx {
namespace {

struct Case {
  const char* name;
  std::optional<std::string> rndv_thresh;
  std::optional<std::string> tls;
  int rdma_devices;
  bool one_host;
  bool eager;
  const char* reason_has;  // a piece of the log line that says why
};

// The cause a reason line speaks of.
EagerCause CauseOfReason(const std::string& reason) {
  if (reason.starts_with("UCX_RNDV_THRESH=")) return EagerCause::kUserThreshold;
  if (reason.starts_with("an RDMA device")) return EagerCause::kRdma;
  if (reason.starts_with("every rank on one host")) return EagerCause::kSharedMemory;
  return EagerCause::kTcpOnly;
}

TEST(UcxEagerPolicy, Table) {
  const std::optional<std::string> unset;
  const Case cases[] = {
      {"user's threshold wins over tcp only", "inf", "tcp,self", 0, false, false,
       "UCX_RNDV_THRESH=inf is set"},
      {"user's threshold wins, even a small one", "8k", unset, 0, false, false,
       "UCX_RNDV_THRESH=8k is set"},
      {"no RDMA device, two hosts", unset, unset, 0, false, true,
       "(no RDMA device; ranks on more than one host)"},
      {"no RDMA device, one host, default TLS", unset, unset, 0, true, false, "one host"},
      {"no RDMA device, one host, sm allowed", unset, "sm,self", 0, true, false, "one host"},
      {"one host, tcp only", unset, "tcp,self", 0, true, true,
       "(no RDMA device; UCX_TLS=tcp,self allows no shared memory)"},
      {"one host, tcp only, RDMA device", unset, "tcp,self", 2, true, true,
       "UCX_TLS=tcp,self allows no RDMA transport; UCX_TLS=tcp,self allows no shared memory"},
      {"RDMA device, default TLS, two hosts", unset, unset, 1, false, false, "an RDMA device (1"},
      {"RDMA device, TLS=tcp, two hosts", unset, "tcp", 1, false, true,
       "UCX_TLS=tcp allows no RDMA transport; ranks on more than one host"},
      {"RDMA device, TLS=rc,sm,self, two hosts", unset, "rc,sm,self", 1, false, false,
       "an RDMA device"},
      {"RDMA device, TLS=ib", unset, "ib", 1, false, false, "an RDMA device"},
      {"RDMA device, TLS=rc_x", unset, "tcp,rc_x", 1, false, false, "an RDMA device"},
      {"RDMA device, TLS=ud_verbs", unset, "ud_verbs,tcp", 1, false, false, "an RDMA device"},
      {"RDMA device, TLS=dc_mlx5", unset, "dc_mlx5", 1, false, false, "an RDMA device"},
      {"RDMA device, TLS=all spelled out", unset, "all", 1, false, false, "an RDMA device"},
      {"RDMA device, TLS upper case, spaces", unset, " RC , tcp", 1, false, false,
       "an RDMA device"},
      {"no RDMA device but TLS=rc", unset, "rc,tcp", 0, false, true, "(no RDMA device;"},
      {"^rc,ud leaves dc", unset, "^rc,ud", 1, false, false, "an RDMA device"},
      {"^rc,ud,dc leaves no RDMA", unset, "^rc,ud,dc", 1, false, true,
       "UCX_TLS=^rc,ud,dc allows no RDMA transport"},
      {"^ib leaves no RDMA", unset, "^ib", 1, false, true, "allows no RDMA transport"},
      {"^ib, one host keeps shared memory", unset, "^ib", 1, true, false, "one host"},
      {"^sm, one host", unset, "^sm", 0, true, true, "UCX_TLS=^sm allows no shared memory"},
      {"^posix,sysv leaves cma", unset, "^posix,sysv", 0, true, false, "one host"},
      {"^posix,sysv,xpmem,cma,knem", unset, "^posix,sysv,xpmem,cma,knem", 0, true, true,
       "allows no shared memory"},
      {"^mm,cma,knem", unset, "^mm,cma,knem", 0, true, true, "allows no shared memory"},
      {"^tcp, two hosts, no device", unset, "^tcp", 0, false, true, "(no RDMA device;"},
      {"empty TLS is all", unset, "", 1, false, false, "an RDMA device"},
      {"shm alias, one host", unset, "shm,tcp", 0, true, false, "one host"},
      {"cma alone, one host", unset, "cma,tcp,self", 0, true, false, "one host"},
  };
  for (const Case& c : cases) {
    const EagerDecision d = DecideEagerSends({c.rndv_thresh, c.tls, c.rdma_devices, c.one_host});
    EXPECT_EQ(d.force_eager, c.eager) << c.name << ": " << d.reason;
    EXPECT_EQ(d.cause, CauseOfReason(d.reason)) << c.name << ": " << d.reason;
    EXPECT_EQ(ParseEagerCause(static_cast<char>(d.cause)), d.cause) << c.name;
    EXPECT_NE(d.reason.find(c.reason_has), std::string::npos) << c.name << ": " << d.reason;
    EXPECT_EQ(d.reason.find('\n'), std::string::npos) << c.name;
    // Every line that leaves the choice to UCX or forces it says how to choose otherwise.
    if (!c.rndv_thresh) {
      EXPECT_NE(d.reason.find("set UCX_RNDV_THRESH to choose otherwise"), std::string::npos)
          << c.name << ": " << d.reason;
    }
  }
}

TEST(UcxEagerPolicy, ForcedLineSaysEagerForEverySize) {
  const EagerDecision d = DecideEagerSends({std::nullopt, std::nullopt, 0, false});
  EXPECT_EQ(d.reason,
            "peers reachable only over TCP (no RDMA device; ranks on more than one host); eager "
            "sends for every size (set UCX_RNDV_THRESH to choose otherwise)");
}

TEST(UcxEagerPolicy, ReachOfTls) {
  EXPECT_TRUE(ReachOfTls(std::nullopt).rdma);
  EXPECT_TRUE(ReachOfTls(std::nullopt).shared_memory);
  EXPECT_FALSE(ReachOfTls("tcp,self").rdma);
  EXPECT_FALSE(ReachOfTls("tcp,self").shared_memory);
  EXPECT_TRUE(ReachOfTls("^rc,ud").rdma);  // dc is left
  EXPECT_TRUE(ReachOfTls("^rc,ud").shared_memory);
  EXPECT_FALSE(ReachOfTls("^rc,ud,dc,sm").rdma);
  EXPECT_FALSE(ReachOfTls("^rc,ud,dc,sm").shared_memory);
  EXPECT_TRUE(ReachOfTls("ud_x").rdma);
  EXPECT_FALSE(ReachOfTls("ud_x").shared_memory);
  EXPECT_TRUE(ReachOfTls("sysv").shared_memory);
  EXPECT_FALSE(ReachOfTls("cuda_copy,cuda_ipc,tcp").rdma);
}

TEST(UcxEagerPolicy, CountRdmaDevicesCountsEntries) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("cortado_ib_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(CountRdmaDevices(dir.string()), 0);  // absent: no device
  std::filesystem::create_directories(dir);
  EXPECT_EQ(CountRdmaDevices(dir.string()), 0);
  std::filesystem::create_directories(dir / "mlx5_0");
  std::ofstream(dir / "mlx5_1") << "x";
  EXPECT_EQ(CountRdmaDevices(dir.string()), 2);
  std::filesystem::remove_all(dir);
}

TEST(UcxEagerPolicy, ParseEagerCauseKnowsTheFourLetters) {
  EXPECT_EQ(ParseEagerCause('u'), EagerCause::kUserThreshold);
  EXPECT_EQ(ParseEagerCause('r'), EagerCause::kRdma);
  EXPECT_EQ(ParseEagerCause('s'), EagerCause::kSharedMemory);
  EXPECT_EQ(ParseEagerCause('t'), EagerCause::kTcpOnly);
  EXPECT_EQ(ParseEagerCause('x'), std::nullopt);
  EXPECT_EQ(ParseEagerCause('\0'), std::nullopt);
}

// Rank 0's line when the ranks did not all choose alike: each group of ranks with the cause of
// its choice. RDMA and shared memory both keep UCX's default, so they agree.
TEST(UcxEagerPolicy, DisagreementNamesTheRanksOfEachChoice) {
  using C = EagerCause;
  struct Row {
    const char* name;
    std::vector<EagerCause> by_rank;
    std::vector<const char*> says;  // empty: they agree, nothing to log
  };
  const Row rows[] = {
      {"one rank", {C::kTcpOnly}, {}},
      {"all eager", {C::kTcpOnly, C::kTcpOnly, C::kTcpOnly}, {}},
      {"all user", {C::kUserThreshold, C::kUserThreshold}, {}},
      {"RDMA and shared memory both keep UCX's default",
       {C::kRdma, C::kSharedMemory, C::kRdma},
       {}},
      {"eager on one rank",
       {C::kSharedMemory, C::kTcpOnly, C::kSharedMemory},
       {"rank(s) 1 force eager sends for every size (peers reachable only over TCP); rank(s) 0, "
        "2 keep UCX's default rendezvous threshold (one host with shared memory)"}},
      {"the user's threshold on some ranks only",
       {C::kTcpOnly, C::kUserThreshold},
       {"rank(s) 0 force eager sends", "rank(s) 1 use the UCX_RNDV_THRESH set for them"}},
      {"RDMA on some hosts only",
       {C::kRdma, C::kRdma, C::kTcpOnly, C::kTcpOnly},
       {"rank(s) 2, 3 force eager",
        "rank(s) 0, 1 keep UCX's default rendezvous threshold (an RDMA "
        "path)"}},
  };
  for (const Row& row : rows) {
    const std::string line = DescribeDisagreement(row.by_rank);
    if (row.says.empty()) {
      EXPECT_EQ(line, "") << row.name;
      continue;
    }
    EXPECT_TRUE(
        line.starts_with("the ranks chose differently between eager sends and rendezvous: "))
        << row.name << ": " << line;
    for (const char* piece : row.says) {
      EXPECT_NE(line.find(piece), std::string::npos) << row.name << ": " << line;
    }
    EXPECT_NE(line.find("set them alike on every rank"), std::string::npos) << line;
    EXPECT_EQ(line.find('\n'), std::string::npos) << row.name;
  }
}

TEST(UcxEagerPolicy, OneHostComparesControlAddresses) {
  EXPECT_EQ(HostOfControlAddress("10.0.0.5:4000"), "10.0.0.5");
  EXPECT_EQ(HostOfControlAddress("127.0.0.1:1"), "127.0.0.1");
  EXPECT_TRUE(AllOnOneHost({}));
  EXPECT_TRUE(AllOnOneHost({"10.0.0.5", "10.0.0.5"}));
  EXPECT_FALSE(AllOnOneHost({"10.0.0.5", "10.0.0.6", "10.0.0.5"}));
}

// One rule for "one host": over UCX each rank publishes, under cortado/host/<rank>, the host its
// transport address carries (the control mesh's address, which Connect compares), before the UCX
// context exists; over TCP, which needs no such choice, nothing is published.
TEST(UcxEagerPolicy, TheCommunicatorGathersTheHostsOfTheTransportAddressesOnlyForUcx) {
  for (const std::string transport : {"ucx", "tcp"}) {
    if (transport == "ucx" && !HasUcxTransport()) continue;
    const int n = 3;
    InMemoryStore store;
    const std::vector<std::string> errors = testing::RunThreads(
        n,
        [](Communicator& comm) {
          std::vector<float> x(17, 1.0f);
          comm.AllReduce(x.data(), x.size(), DataType::kF32, ReduceOp::kSum);
        },
        testing::OptionsFor(transport), &store);
    const Deadline soon = Deadline::After(std::chrono::seconds(1));
    for (int r = 0; r < n; ++r) {
      const std::string key = "cortado/host/" + std::to_string(r);
      EXPECT_EQ(errors[static_cast<size_t>(r)], "") << transport << " rank " << r;
      if (transport == "ucx") {
        ASSERT_TRUE(store.Check({key})) << key;
        const std::string address = store.Get("cortado/addr/" + std::to_string(r), soon);
        const std::string control = address.substr(0, address.find('|'));
        EXPECT_EQ(store.Get(key, soon), HostOfControlAddress(control)) << key << ", " << address;
      } else {
        EXPECT_FALSE(store.Check({key})) << key;
      }
    }
  }
}

// A transport made without a host exchange takes the ranks to be on one host for its choice;
// when their control addresses (127.0.0.1 and 127.0.0.2 here) then name two hosts, rank 0 says
// the choice rested on that assumption, and the ranks still connect (over tcp: endpoints between
// hosts ask for peer error handling).
TEST(UcxEagerPolicy, AChoiceMadeForOneHostIsReportedWhenTheAddressesNameTwo) {
  if (!HasUcxTransport()) GTEST_SKIP() << "the UCX transport is not built";
  if (std::getenv("UCX_RNDV_THRESH") || std::getenv("UCX_TLS") || CountRdmaDevices() > 0) {
    GTEST_SKIP() << "the choice here must be the one for shared memory on one host";
  }
  const int n = 2;
  std::vector<std::unique_ptr<Transport>> ts;
  std::vector<std::string> addresses;
  ::testing::internal::CaptureStderr();
  for (int r = 0; r < n; ++r) {
    UcxTransportOptions o;
    o.identity = JobIdentity{"tok", n, 42};
    o.rank = r;
    o.control_host = r == 0 ? "127.0.0.1" : "127.0.0.2";
    ts.push_back(CreateUcxTransport(o));
    addresses.push_back(ts.back()->LocalAddress());
  }
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ts[static_cast<size_t>(r)]->Connect(addresses, Deadline::After(std::chrono::seconds(20)));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::string err = ::testing::internal::GetCapturedStderr();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  const std::string line =
      "cortado: ucx transport: the eager choice took every rank to be on one host (this transport "
      "was made without a host exchange), but their control addresses name more than one";
  const size_t at = err.find(line);
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find(line, at + 1), std::string::npos) << "logged twice\n" << err;
}

}  // namespace
}  // namespace cortado::dist::ucx
