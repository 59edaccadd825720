// Internal: the backend factories behind CreateCommunicator.
#pragma once

#include <memory>

#include "cortado/dist/communicator.h"

namespace cortado::dist::internal {

// Collectives over a Transport (TCP or UCX, CommOptions::transport), with rendezvous through a
// Store.
std::unique_ptr<Communicator> CreateTransportCommunicator(const CommConfig& config);

#ifdef CORTADO_DIST_HAS_MPI
// Collectives over MPI_COMM_WORLD (initializes MPI when the program has not).
std::unique_ptr<Communicator> CreateMpiCommunicator(const CommOptions& options);
#endif

}  // namespace cortado::dist::internal
