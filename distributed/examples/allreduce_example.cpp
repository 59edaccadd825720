// A program that uses only cortado_distributed: every rank contributes its rank number, and all
// of them print the sum. Run it with any launcher the library understands:
//   cortado launch --nproc 4 -- ./cortado_dist_allreduce
//   mpirun -np 4 ./cortado_dist_allreduce                    (CORTADO_BACKEND=tcp or mpi)
//   torchrun-style, one shell per rank (r = 0, 1):
//     RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 CORTADO_JOB_TOKEN=demo
//     ./cortado_dist_allreduce
#include <cstdio>
#include <vector>

#include "cortado/dist/communicator.h"

int main() {
  using namespace cortado::dist;
  try {
    std::unique_ptr<Communicator> comm = CreateCommunicatorFromEnv(Fingerprint("example v1"));
    std::vector<float> values(1000, static_cast<float>(comm->rank()));
    comm->AllReduce(values.data(), values.size(), DataType::kF32, ReduceOp::kSum);
    float expected = comm->size() * (comm->size() - 1) / 2.0f;
    // Overlap: queue a broadcast from the last rank, then wait for it.
    int token = comm->rank() == comm->size() - 1 ? 42 : 0;
    float token_f = static_cast<float>(token);
    auto work = comm->BroadcastAsync(&token_f, 1, DataType::kF32, comm->size() - 1);
    work->Wait();
    comm->Barrier();
    std::printf("rank %d of %d (%s): sum of ranks = %g (expected %g), broadcast = %g\n",
                comm->rank(), comm->size(), comm->backend(), values[0], expected, token_f);
    return values[0] == expected && token_f == 42.0f ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "allreduce example: %s error: %s\n", ErrorKindName(e.kind()), e.what());
    return 1;
  }
}
