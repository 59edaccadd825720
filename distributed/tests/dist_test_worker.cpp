// A rank of the process tests: `dist_test_worker SCENARIO [ARGS]`, with the Cortado environment
// set by the test (test_util.cpp) or by mpirun. Prints what happened and exits 0 on success.
//   matrix [COUNTS]          every collective (matrix.h); COUNTS like "0,1,17" (default: all)
//   kill VICTIM BYTES        all-reduces of BYTES in a loop; VICTIM SIGKILLs itself mid-way
//   stall SLEEPER SLEEP_MS   one all-reduce, then SLEEPER sleeps before the second
//   mpi_stall SLEEPER MS     the same over the MPI backend (CORTADO_BACKEND=mpi)
// Failures print "ERROR kind=K peer=P op=O t_us=T msg=M" (T: CLOCK_MONOTONIC microseconds).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cortado/dist/communicator.h"
#include "matrix.h"
#include "test_util.h"

using namespace cortado::dist;

namespace {

void PrintError(const Error& e) {
  std::printf("ERROR kind=%s peer=%d op=%s t_us=%lld msg=%s\n", ErrorKindName(e.kind()),
              e.peer_rank(), e.op().c_str(), cortado::dist::testing::MonotonicMicros(), e.what());
  std::fflush(stdout);
}

int Matrix(const std::string& counts_text) {
  std::vector<size_t> counts;
  if (counts_text.empty()) {
    counts = cortado::dist::testing::DefaultCounts();
  } else {
    size_t start = 0;
    while (start < counts_text.size()) {
      size_t comma = counts_text.find(',', start);
      if (comma == std::string::npos) comma = counts_text.size();
      counts.push_back(std::stoul(counts_text.substr(start, comma - start)));
      start = comma + 1;
    }
  }
  auto comm = CreateCommunicatorFromEnv(Fingerprint("worker"));
  auto failures = cortado::dist::testing::RunMatrix(*comm, counts);
  for (const auto& f : failures) std::printf("FAIL %s\n", f.c_str());
  std::printf("MATRIX %s rank %d of %d (%s)\n", failures.empty() ? "OK" : "FAILED", comm->rank(),
              comm->size(), comm->backend());
  return failures.empty() ? 0 : 1;
}

int Kill(int victim, size_t bytes) {
  auto comm = CreateCommunicatorFromEnv(Fingerprint("worker"));
  std::vector<float> buf(bytes / 4, 1.0f);
  comm->Barrier();
  for (int iter = 0; iter < 50; ++iter) {
    if (comm->rank() == victim && iter == 1) {
      // Start the all-reduce on the worker thread, let it get going, then die hard.
      auto work = comm->AllReduceAsync(buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum);
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      std::printf("KILL t_us=%lld done=%d\n", cortado::dist::testing::MonotonicMicros(),
                  work->Test() ? 1 : 0);
      std::fflush(stdout);
      ::kill(::getpid(), SIGKILL);
    }
    comm->AllReduce(buf.data(), buf.size(), DataType::kF32, ReduceOp::kAvg);
  }
  std::printf("COMPLETED without noticing the dead rank\n");
  return 2;
}

int Stall(int sleeper, int sleep_ms) {
  auto comm = CreateCommunicatorFromEnv(Fingerprint("worker"));
  std::vector<float> buf(1000, 1.0f);
  comm->AllReduce(buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum);
  if (comm->rank() == sleeper) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  std::printf("ENTER t_us=%lld\n", cortado::dist::testing::MonotonicMicros());
  std::fflush(stdout);
  comm->AllReduce(buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum);
  std::printf("COMPLETED\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = argc > 1 ? argv[1] : "";
  try {
    if (scenario == "matrix") return Matrix(argc > 2 ? argv[2] : "");
    if (scenario == "kill" && argc > 3) return Kill(std::atoi(argv[2]), std::stoul(argv[3]));
    if ((scenario == "stall" || scenario == "mpi_stall") && argc > 3) {
      return Stall(std::atoi(argv[2]), std::atoi(argv[3]));
    }
    std::fprintf(stderr, "usage: dist_test_worker matrix|kill|stall|mpi_stall ...\n");
    return 64;
  } catch (const Error& e) {
    PrintError(e);
    return 3;
  } catch (const std::exception& e) {
    std::printf("ERROR kind=other peer=-1 op= t_us=%lld msg=%s\n",
                cortado::dist::testing::MonotonicMicros(), e.what());
    return 4;
  }
}
