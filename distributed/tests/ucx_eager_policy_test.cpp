// The UCX transport's choice between eager sends and UCX's rendezvous (transport/ucx/
// eager_policy.h), as a table: the user's UCX_RNDV_THRESH, UCX_TLS (lists, aliases and '^'
// exclusions), the host's RDMA devices and whether every rank is on one host (needs no UCX);
// and the host names the communicator gathers for the UCX transport before it exists.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cortado/dist/communicator.h"
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

// The policy's one_host comes from every rank's host name, gathered through the rendezvous store
// before the UCX context exists: over UCX each rank publishes gethostname() under
// cortado/host/<rank>; over TCP, which needs no such choice, nothing is published.
TEST(UcxEagerPolicy, TheCommunicatorGathersHostNamesOnlyForUcx) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
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
    for (int r = 0; r < n; ++r) {
      const std::string key = "cortado/host/" + std::to_string(r);
      EXPECT_EQ(errors[static_cast<size_t>(r)], "") << transport << " rank " << r;
      if (transport == "ucx") {
        ASSERT_TRUE(store.Check({key})) << key;
        EXPECT_EQ(store.Get(key, Deadline::After(std::chrono::seconds(1))), host) << key;
      } else {
        EXPECT_FALSE(store.Check({key})) << key;
      }
    }
  }
}

}  // namespace
}  // namespace cortado::dist::ucx
