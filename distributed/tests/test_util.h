// Test harnesses: N ranks as threads of this process (in-memory store, real loopback sockets),
// and N ranks as processes of the dist_test_worker helper (TCP store on a port the test binds
// and hands to rank 0, so parallel tests never race for ports).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cortado/dist/communicator.h"
#include "cortado/dist/store.h"
#include "cortado/dist/ucx_transport.h"

namespace cortado::dist::testing {

// The transports the collective suites run over (CORTADO_TRANSPORT values). A suite takes one as
// its parameter and calls SkipUnlessBuilt first: the UCX cases skip, saying why, in builds
// without libucx.
inline std::vector<std::string> TransportNames() { return {"tcp", "ucx"}; }
#define CORTADO_SKIP_UNLESS_BUILT(transport)                                           \
  do {                                                                                 \
    if ((transport) == std::string("ucx") && !::cortado::dist::HasUcxTransport()) {    \
      GTEST_SKIP() << "the UCX transport is not built (libucx-dev was not found when " \
                      "this build was configured)";                                    \
    }                                                                                  \
  } while (0)

// Whether the ranks of one host share memory over this transport in this build (UCX does,
// except in ThreadSanitizer builds: see UcxTransport::Allocate), so that all-reduces of
// registered memory run 'direct'.
inline bool SharesMemoryInThisBuild(const std::string& transport) {
#if defined(CORTADO_TSAN)
  return false;
#else
  return transport == "ucx";
#endif
}

inline CommOptions OptionsFor(const std::string& transport, CommOptions options = CommOptions()) {
  options.transport = ParseTransportKind(transport);
  return options;
}

// Parameters (transport, ranks) and their test names ("ucx_3").
using TransportRanks = std::tuple<std::string, int>;
inline std::string TransportRanksName(const ::testing::TestParamInfo<TransportRanks>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param));
}
inline std::string TransportName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

// Runs fn(rank's communicator) on n threads; returns each rank's exception text ("" if none).
// The ranks meet through shared_store when given (to read what they published), else their own.
inline std::vector<std::string> RunThreads(int n, const std::function<void(Communicator&)>& fn,
                                           CommOptions options = CommOptions(),
                                           InMemoryStore* shared_store = nullptr) {
  InMemoryStore own_store;
  InMemoryStore& store = shared_store != nullptr ? *shared_store : own_store;
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommConfig config;
        config.rank = r;
        config.world_size = n;
        config.store = &store;
        config.options = options;
        auto comm = CreateCommunicator(config);
        fn(*comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        if (errors[static_cast<size_t>(r)].empty())
          errors[static_cast<size_t>(r)] = "(empty error)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

struct ProcessResult {
  int code = -1;  // exit code, 128 + signal, or -1 when killed at the test's deadline
  std::string output;
};

// Starts n copies of the worker (argv after the program) with the Cortado environment for each
// rank plus `env` (and per_rank_env(rank) when given), waits up to timeout_s, and collects each
// one's exit code and combined output.
std::vector<ProcessResult> RunProcesses(
    int n, const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
    double timeout_s,
    const std::function<std::map<std::string, std::string>(int)>& per_rank_env = nullptr);

// The monotonic clock in microseconds (comparable across processes of this machine).
long long MonotonicMicros();

// The whole file ("" when it cannot be read).
std::string ReadWholeFile(const std::string& path);

}  // namespace cortado::dist::testing
