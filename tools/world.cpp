#include "tools/world.h"

#include <cstdlib>

#include "cortado/dist/env.h"
#include "cortado/dist/error.h"
#include "engine/base/env.h"
#include "engine/base/error.h"

namespace cortado {

World JoinWorld(const DistributedConfig& config) {
  dist::CommOptions options = dist::CommOptions::FromEnv();
  if (!config.backend.empty()) {
    options.backend = config.backend == "mpi" ? dist::Backend::kMpi : dist::Backend::kCortado;
  }
  if (!config.transport.empty()) options.transport = dist::ParseTransportKind(config.transport);
  if (config.timeout_s > 0) {
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.timeout_s * 1000));
  }
  if (config.connect_timeout_s > 0) {
    options.connect_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(config.connect_timeout_s * 1000));
  }
  World world;
  if (options.backend == dist::Backend::kMpi) {
    CORTADO_CHECK(dist::HasMpiBackend(),
                  "distributed.backend is mpi, but this build has no MPI "
                  "backend (install openmpi-bin and libopenmpi-dev, then reconfigure)");
    world.comm = dist::CreateCommunicator(dist::CommConfigFor(dist::LaunchInfo{}, options));
    world.rank = world.comm->rank();
    world.size = world.comm->size();
    // Started by another launcher (cortado launch, torchrun), each process is an MPI job of
    // its own: W independent trainings into one folder. Refuse.
    const dist::LaunchInfo launched = dist::DiscoverLaunchInfo();
    CORTADO_CHECK(world.size > 1 || launched.world_size == 1,
                  "distributed.backend is mpi, but "
                  "this process is a 1-rank MPI job while its launcher (",
                  launched.source, ") started ", launched.world_size,
                  " ranks; run under mpirun, or use "
                  "distributed.backend: cortado");
    // mpirun also says how many ranks share this machine.
    world.local_size = static_cast<int>(EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE", 1, 1, 1 << 20));
    world.local_rank =
        static_cast<int>(EnvInt("OMPI_COMM_WORLD_LOCAL_RANK", 0, 0, world.local_size - 1));
    if (world.size == 1) world.comm.reset();
    world.backend = world.comm ? "mpi" : "local";
    return world;
  }
  dist::LaunchInfo info = dist::DiscoverLaunchInfo();
  world.rank = info.rank;
  world.size = info.world_size;
  world.local_rank = info.local_rank;
  world.local_size = std::max(1, info.local_world_size);
  if (world.size == 1) return world;
  // No config fingerprint in the handshake: the trainer compares configs itself after
  // connecting, so a mismatch can say what differs (DataParallel::VerifySameJob).
  try {
    world.comm = dist::CreateCommunicator(dist::CommConfigFor(info, options));
  } catch (const dist::Error& e) {
    // Rendezvous errors name the address; say where the port came from, the thing to change.
    const std::string what = e.what();
    const std::string port = std::to_string(info.master_port);
    if (what.find(":" + port) == std::string::npos) throw;
    const char* from =
        std::getenv("CORTADO_LAUNCH_COMMAND") ? "from CORTADO_MASTER_PORT, set by cortado launch"
        : std::getenv("CORTADO_MASTER_PORT")  ? "from CORTADO_MASTER_PORT"
        : std::getenv("MASTER_PORT")          ? "from MASTER_PORT"
                                              : "derived from the job id: set CORTADO_MASTER_PORT "
                                                "to choose another";
    throw dist::Error(e.kind(),
                      StrCat(what, " (master ", info.master_addr, ":", port, ", port ", from, ")"),
                      e.peer_rank(), e.op(), e.ranks());
  }
  world.backend = world.comm->backend();
  return world;
}

}  // namespace cortado
