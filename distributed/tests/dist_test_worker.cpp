// A rank of the process tests: `dist_test_worker SCENARIO [ARGS]`, with the Cortado environment
// set by the test (test_util.cpp) or by mpirun. Prints what happened and exits 0 on success.
//   matrix [COUNTS]          every collective (matrix.h); COUNTS like "0,1,17" (default: all)
//   split [COUNTS]           Split by rank / 2 and by rank % 2 (keys reversed), the matrix on
//                            both children (default COUNTS 0,1,17,5003), a nested split, and a
//                            child's all-reduces from this thread while the parent's worker
//                            runs a 16 MB all-reduce
//   kill VICTIM BYTES [registered]  all-reduces of BYTES in a loop; VICTIM SIGKILLs itself
//                            mid-way (registered: the buffer from AllocateRegistered, so over
//                            UCX on one host the all-reduces run 'direct')
//   stall SLEEPER SLEEP_MS   one all-reduce, then SLEEPER sleeps before the second
//   mpi_stall SLEEPER MS     the same over the MPI backend (CORTADO_BACKEND=mpi)
//   split_stall SLEEPER MS   the same on world->Split(0, -rank) (SLEEPER is a world rank)
// Before the scenario, `--mpi-init-serialized` (MPI builds) makes the program initialize MPI
// itself with MPI_THREAD_SERIALIZED, so the backend must serialize its MPI calls.
// Failures print "ERROR kind=K peer=P ranks=R op=O t_us=T msg=M" (R: Error::ranks() joined by
// commas, or -; T: CLOCK_MONOTONIC microseconds).
#include <signal.h>
#include <unistd.h>

#ifdef CORTADO_DIST_TEST_HAS_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cortado/dist/communicator.h"
#include "matrix.h"
#include "test_util.h"

using namespace cortado::dist;

namespace {

void PrintError(const Error& e) {
  std::string ranks;
  for (int r : e.ranks()) {
    if (!ranks.empty()) ranks += ',';
    ranks += std::to_string(r);
  }
  std::printf("ERROR kind=%s peer=%d ranks=%s op=%s t_us=%lld msg=%s\n", ErrorKindName(e.kind()),
              e.peer_rank(), ranks.empty() ? "-" : ranks.c_str(), e.op().c_str(),
              cortado::dist::testing::MonotonicMicros(), e.what());
  std::fflush(stdout);
}

std::vector<size_t> ParseCounts(const std::string& counts_text) {
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
  return counts;
}

int Matrix(const std::string& counts_text) {
  std::vector<size_t> counts = ParseCounts(counts_text);
  auto comm = CreateCommunicatorFromEnv(Fingerprint("worker"));
  auto failures = cortado::dist::testing::RunMatrix(*comm, counts);
  for (const auto& f : failures) std::printf("FAIL %s\n", f.c_str());
  std::printf("MATRIX %s rank %d of %d (%s)\n", failures.empty() ? "OK" : "FAILED", comm->rank(),
              comm->size(), comm->backend());
  return failures.empty() ? 0 : 1;
}

// Checks one child of a split: its size, this rank's rank in it, and that an all-reduce and an
// all-gather over it see exactly its members, in child-rank order.
void CheckChild(Communicator& world, Communicator& child, const std::vector<int>& members,
                const std::string& what, std::vector<std::string>* failures) {
  auto fail = [&](const std::string& line) {
    failures->push_back(what + ": world rank " + std::to_string(world.rank()) + ": " + line);
  };
  if (child.size() != static_cast<int>(members.size())) {
    fail("size " + std::to_string(child.size()) + ", want " + std::to_string(members.size()));
    return;
  }
  auto me = std::find(members.begin(), members.end(), world.rank());
  if (me == members.end() || child.rank() != me - members.begin()) {
    fail("rank " + std::to_string(child.rank()) + " is not this rank's place in the group");
    return;
  }
  float sum = static_cast<float>(world.rank()), want = 0;
  for (int m : members) want += static_cast<float>(m);
  child.AllReduce(&sum, 1, DataType::kF32, ReduceOp::kSum);
  if (sum != want) fail("all-reduce of world ranks gave " + std::to_string(sum));
  float mine = static_cast<float>(world.rank());
  std::vector<float> all(members.size());
  child.AllGather(&mine, all.data(), 1, DataType::kF32);
  for (size_t i = 0; i < members.size(); ++i) {
    if (all[i] != static_cast<float>(members[i])) fail("all-gather order differs from the keys");
  }
}

int SplitScenario(const std::string& counts_text) {
  std::vector<size_t> counts = ParseCounts(counts_text.empty() ? "0,1,17,5003" : counts_text);
  auto world = CreateCommunicatorFromEnv(Fingerprint("worker"));
  const int r = world->rank(), n = world->size();
  std::vector<std::string> failures;
  // Pairs of consecutive ranks (batch-norm groups), in rank order.
  auto pairs = world->Split(r / 2, r);
  std::vector<int> pair_members;
  for (int q = 0; q < n; ++q) {
    if (q / 2 == r / 2) pair_members.push_back(q);
  }
  CheckChild(*world, *pairs, pair_members, "split(rank / 2, rank)", &failures);
  // Even and odd ranks, with reversed keys: the highest world rank becomes rank 0.
  auto parity = world->Split(r % 2, -r);
  std::vector<int> parity_members;
  for (int q = n - 1; q >= 0; --q) {
    if (q % 2 == r % 2) parity_members.push_back(q);
  }
  CheckChild(*world, *parity, parity_members, "split(rank % 2, -rank)", &failures);
  for (auto* child : {pairs.get(), parity.get()}) {
    for (const auto& f : cortado::dist::testing::RunMatrix(*child, counts)) {
      failures.push_back("child of " + std::to_string(child->size()) + ": " + f);
    }
  }
  // A split of a split (its rendezvous goes through the same store, under nested keys).
  auto nested = parity->Split(0, parity->rank());
  CheckChild(*world, *nested, parity_members, "nested split", &failures);
  // The priority lane: a child's small all-reduces from this thread while the parent's worker
  // runs a 16 MB all-reduce; both results must be right.
  auto lane = world->Split(0, r);
  std::vector<float> big(4 << 20, static_cast<float>(r + 1));
  auto work = world->AllReduceAsync(big.data(), big.size(), DataType::kF32, ReduceOp::kSum);
  int during = 0;
  for (int i = 0; i < 100; ++i) {
    float v[4] = {1, 2, 3, static_cast<float>(i)};
    lane->AllReduce(v, 4, DataType::kF32, ReduceOp::kSum);
    if (v[0] != static_cast<float>(n) || v[3] != static_cast<float>(i * n)) {
      failures.push_back("lane all-reduce " + std::to_string(i) + " wrong");
      break;
    }
    if (!work->Test()) ++during;
  }
  work->Wait();
  const float want = static_cast<float>(n * (n + 1) / 2);
  if (std::any_of(big.begin(), big.end(), [&](float x) { return x != want; })) {
    failures.push_back("parent all-reduce beside the lane is wrong");
  }
  world->Barrier();
  for (const auto& f : failures) std::printf("FAIL %s\n", f.c_str());
  std::printf("SPLIT %s rank %d of %d (%s), lane all-reduces during the parent's: %d\n",
              failures.empty() ? "OK" : "FAILED", r, n, world->backend(), during);
  return failures.empty() ? 0 : 1;
}

int Kill(int victim, size_t bytes, bool registered) {
  auto comm = CreateCommunicatorFromEnv(Fingerprint("worker"));
  std::vector<float> plain;
  std::unique_ptr<RegisteredMemory> memory;
  float* buf = nullptr;
  const size_t count = bytes / 4;
  if (registered) {
    memory = comm->AllocateRegistered(bytes);
    buf = static_cast<float*>(memory->data());
    std::fill(buf, buf + count, 1.0f);
  } else {
    plain.assign(count, 1.0f);
    buf = plain.data();
  }
  std::printf("ALGO %s\n", comm->AllReduceAlgorithmFor(bytes, Algorithm::kAuto, buf).c_str());
  comm->Barrier();
  for (int iter = 0; iter < 50; ++iter) {
    if (comm->rank() == victim && iter == 1) {
      // Start the all-reduce on the worker thread, let it get going, then die hard.
      auto work = comm->AllReduceAsync(buf, count, DataType::kF32, ReduceOp::kAvg);
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      std::printf("KILL t_us=%lld done=%d\n", cortado::dist::testing::MonotonicMicros(),
                  work->Test() ? 1 : 0);
      std::fflush(stdout);
      ::kill(::getpid(), SIGKILL);
    }
    comm->AllReduce(buf, count, DataType::kF32, ReduceOp::kAvg);
  }
  std::printf("COMPLETED without noticing the dead rank\n");
  return 2;
}

int Stall(int sleeper, int sleep_ms, bool split) {
  auto world = CreateCommunicatorFromEnv(Fingerprint("worker"));
  const bool sleeps = world->rank() == sleeper;
  std::unique_ptr<Communicator> child;
  if (split) child = world->Split(0, -world->rank());
  Communicator* comm = split ? child.get() : world.get();
  std::vector<float> buf(1000, 1.0f);
  comm->AllReduce(buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum);
  if (sleeps) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  std::printf("ENTER t_us=%lld\n", cortado::dist::testing::MonotonicMicros());
  std::fflush(stdout);
  try {
    comm->AllReduce(buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum);
  } catch (const Error& e) {
    // Printed here, while the communicators live: a broken MPI one aborts the job when destroyed.
    PrintError(e);
    return 3;
  }
  std::printf("COMPLETED\n");
  return 0;
}

}  // namespace

int Run(const std::string& scenario, int argc, char** argv) {
  if (scenario == "matrix") return Matrix(argc > 2 ? argv[2] : "");
  if (scenario == "split") return SplitScenario(argc > 2 ? argv[2] : "");
  if (scenario == "kill" && argc > 3) {
    return Kill(std::atoi(argv[2]), std::stoul(argv[3]),
                argc > 4 && std::string(argv[4]) == "registered");
  }
  if ((scenario == "stall" || scenario == "mpi_stall" || scenario == "split_stall") && argc > 3) {
    return Stall(std::atoi(argv[2]), std::atoi(argv[3]), scenario == "split_stall");
  }
  std::fprintf(stderr,
               "usage: dist_test_worker [--mpi-init-serialized] "
               "matrix|split|kill|stall|mpi_stall|split_stall ...\n");
  return 64;
}

int main(int argc, char** argv) {
  bool mpi_init_serialized = argc > 1 && std::string(argv[1]) == "--mpi-init-serialized";
  if (mpi_init_serialized) {
    --argc;
    ++argv;
#ifdef CORTADO_DIST_TEST_HAS_MPI
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    std::printf("MPI initialized by the program: thread level %d\n", provided);
#else
    std::fprintf(stderr, "--mpi-init-serialized: this worker was built without MPI\n");
    return 64;
#endif
  }
  std::string scenario = argc > 1 ? argv[1] : "";
  int code = 0;
  try {
    code = Run(scenario, argc, argv);
  } catch (const Error& e) {
    PrintError(e);
    code = 3;
  } catch (const std::exception& e) {
    std::printf("ERROR kind=other peer=-1 ranks=- op= t_us=%lld msg=%s\n",
                cortado::dist::testing::MonotonicMicros(), e.what());
    code = 4;
  }
#ifdef CORTADO_DIST_TEST_HAS_MPI
  // The communicators are gone (a broken one has aborted the job); the program finalizes what
  // it initialized.
  if (mpi_init_serialized) MPI_Finalize();
#endif
  return code;
}
