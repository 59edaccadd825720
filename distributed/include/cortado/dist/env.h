// Where a process learns who it is: its rank, the world size, where rank 0's store listens and
// the job token that admits it. Read from the environments users already have, in this order of
// precedence (the first family whose rank variable is set wins):
//   1. Cortado:   CORTADO_RANK, CORTADO_WORLD_SIZE, CORTADO_LOCAL_RANK, CORTADO_LOCAL_WORLD_SIZE,
//                 CORTADO_MASTER_ADDR, CORTADO_MASTER_PORT (set by `cortado launch`)
//   2. torchrun:  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   3. mpirun:    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (Open MPI)
//   4. srun:      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (Slurm)
// With none set the process is rank 0 of a world of 1. CORTADO_MASTER_ADDR/PORT (then
// MASTER_ADDR/PORT) override the master of any family; mpirun and srun jobs without them use
// 127.0.0.1 when every rank is local (Slurm: the first host of SLURM_JOB_NODELIST) and a port
// derived from the job id, so `mpirun -np 2 prog` works as is.
//
// The job token (FindJobToken) must be the same on every rank: CORTADO_JOB_TOKEN, else one derived
// from the launcher's job identity (SLURM_JOB_ID + SLURM_STEP_ID, PMIX_NAMESPACE or
// OMPI_MCA_ess_base_jobid, TORCHELASTIC_RUN_ID). Jobs of world size 1 need none.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace cortado::dist {

// Looks up an environment variable; tests pass a map instead of the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup ProcessEnv();

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: none known (only valid for world size 1)
  std::string job_token;
  // Which environment family was used: "cortado", "torchrun", "mpirun", "slurm" or "default".
  std::string source = "default";
  // A listening socket inherited from `cortado launch` for rank 0's store (CORTADO_STORE_FD);
  // -1 when rank 0 must bind master_port itself.
  int store_fd = -1;
};

// Reads the environment as described above. Throws kConfig naming the variable that is
// malformed, or CORTADO_JOB_TOKEN when a multi-rank job has no token.
LaunchInfo DiscoverLaunchInfo(const EnvLookup& env = ProcessEnv());

// The job token: CORTADO_JOB_TOKEN, else derived from the launcher's job identity, else
// std::nullopt.
std::optional<std::string> FindJobToken(const EnvLookup& env = ProcessEnv());

// 64-bit FNV-1a of text: job-token digests and config fingerprints.
uint64_t Fingerprint(std::string_view text);

// The identity every connection's handshake checks: same token, world size and fingerprint
// (an opaque hash the caller passes, e.g. of its config) on every rank.
struct JobIdentity {
  std::string token;
  int world_size = 1;
  uint64_t fingerprint = 0;
  uint64_t TokenDigest() const { return Fingerprint(token); }
};

// Who runs the collectives (CORTADO_BACKEND): this library's own algorithms over a Transport, or
// Open MPI's. Which transport carries Cortado's collectives is a separate choice
// (CORTADO_TRANSPORT). The old value CORTADO_BACKEND=tcp still means kCortado (over TCP).
enum class Backend { kCortado, kMpi };
const char* BackendName(Backend backend);  // "cortado", "mpi"

// The point-to-point transport under Cortado's collectives (CORTADO_TRANSPORT): the built-in TCP
// transport (no dependencies, the default) or UCX (shared memory, TCP, InfiniBand/RoCE; only in
// builds that found libucx, see HasUcxTransport in transport_factory.h).
enum class TransportKind { kTcp, kUcx };
const char* TransportKindName(TransportKind kind);          // "tcp", "ucx"
TransportKind ParseTransportKind(const std::string& name);  // throws kConfig listing the known

// Algorithm selection. kAuto picks by message size (see CommOptions); the others force one:
// all-reduce: kRing, kHalvingDoubling or kDirect (every rank reduces its slice straight from
// the other ranks' memory; only where the transport shares memory and the buffers come from
// Communicator::AllocateRegistered, see communicator.h); broadcast: kRing (a pipelined chain)
// or kTree (binomial); all-gather, reduce-scatter: kRing.
enum class Algorithm { kAuto, kRing, kHalvingDoubling, kTree, kDirect };
const char* AlgorithmName(Algorithm algo);  // "auto", "ring", "halving_doubling", "tree", "direct"
Algorithm ParseAlgorithm(const std::string& name);  // also accepts "hd"

// Tunables of a communicator. Each field is read from the CORTADO_* variable named beside it by
// FromEnv(); the defaults suit a commodity Ethernet or loopback link.
struct CommOptions {
  std::chrono::milliseconds timeout{300000};      // CORTADO_TIMEOUT_S: deadline of every operation
  Backend backend = Backend::kCortado;            // CORTADO_BACKEND: cortado | mpi (tcp: cortado)
  TransportKind transport = TransportKind::kTcp;  // CORTADO_TRANSPORT: tcp | ucx
  std::string socket_ifname;                      // CORTADO_SOCKET_IFNAME: interface to listen on
  Algorithm allreduce_algorithm = Algorithm::kAuto;  // CORTADO_ALLREDUCE_ALGO
  size_t allreduce_small_bytes = 512 << 10;          // CORTADO_ALLREDUCE_SMALL_BYTES: auto uses
                                                     //   halving-doubling at or below, ring above
  size_t broadcast_small_bytes = 256 << 10;      // CORTADO_BROADCAST_SMALL_BYTES: tree at or below
  size_t chunk_bytes = 256 << 10;                // CORTADO_CHUNK_BYTES: pipelining granularity
  int pipeline_depth = 1;                        // CORTADO_PIPELINE_DEPTH: first-step chunks in
                                                 //   flight ahead of the reduction
  int socket_buffer_bytes = 0;                   // CORTADO_SOCKET_BUFFER: SO_SNDBUF/SO_RCVBUF;
                                                 //   0 keeps kernel autotuning
  int spin_us = 50;                              // CORTADO_SPIN_US: poll before sleeping
  std::chrono::milliseconds connect_timeout{0};  // CORTADO_CONNECT_TIMEOUT_S: rendezvous and
                                                 //   mesh setup; 0: same as timeout

  static CommOptions FromEnv(const EnvLookup& env = ProcessEnv());
  std::chrono::milliseconds EffectiveConnectTimeout() const {
    return connect_timeout.count() > 0 ? connect_timeout : timeout;
  }
};

// Parses "4K", "64M", "1G", "123" (K = 1024); throws kInvalidArgument naming the text.
size_t ParseByteSize(const std::string& text);
// Formats bytes the same way ("4K", "64M", "1000").
std::string FormatByteSize(size_t bytes);

}  // namespace cortado::dist
