// Internal: what the transports (tcp/, ucx/) share beyond the Transport interface.
#pragma once

#include <cstddef>

#include "cortado/dist/transport.h"

namespace cortado::dist::internal {

// A posted transfer's arguments: [offset, offset + bytes) inside the region, and a peer other
// than this rank. Throws kInvalidArgument naming what is wrong.
void CheckTransfer(const MemoryRegion& region, size_t offset, size_t bytes, int peer, int rank,
                   int size);

}  // namespace cortado::dist::internal
