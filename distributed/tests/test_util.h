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
#include <vector>

#include "cortado/dist/communicator.h"
#include "cortado/dist/store.h"

namespace cortado::dist::testing {

// Runs fn(rank's communicator) on n threads; returns each rank's exception text ("" if none).
inline std::vector<std::string> RunThreads(int n, const std::function<void(Communicator&)>& fn,
                                           CommOptions options = CommOptions()) {
  InMemoryStore store;
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

}  // namespace cortado::dist::testing
