// World: this process's place in a data-parallel job and the communicators the trainer uses.
//
// Rank and world size come from the launcher's environment (cortado launch, torchrun, mpirun,
// srun; distributed/README.md lists the variables); the `distributed:` config section chooses
// the backend and deadlines, overriding CORTADO_BACKEND / CORTADO_TIMEOUT_S /
// CORTADO_CONNECT_TIMEOUT_S when given. A world of one has no communicator at all: nothing is
// all-reduced and training is exactly the single-process loop.
#pragma once

#include <memory>
#include <string>

#include "cortado/dist/communicator.h"
#include "tools/run_config.h"

namespace cortado {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;  // ranks on this machine (they share its cores)
  std::string backend = "local";
  std::unique_ptr<dist::Communicator> comm;  // null when size == 1
};

// Joins the job described by the environment; connects the ranks when there is more than one
// (every rank of the job must call it). Throws naming the variable or key that is wrong, or the
// ranks that did not join in time.
World JoinWorld(const DistributedConfig& config);

}  // namespace cortado
