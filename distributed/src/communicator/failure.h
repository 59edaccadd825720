// Internal: what both backends (transport_communicator.cpp, mpi_communicator.cpp) do when an
// operation fails for good: the communicator breaks, and a timeout names the ranks that never
// reached the operation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cortado/dist/transport.h"

namespace cortado::dist::internal {

// Why a communicator is unusable after a failure it cannot recover from (a collective that
// cannot be cancelled, an aborted transport): every later operation throws kPeerFailure with it.
struct Breakage {
  bool broken = false;
  std::string what;
  int rank = -1;  // the rank blamed, or -1

  void Set(std::string message, int blamed) {
    broken = true;
    what = std::move(message);
    rank = blamed;
  }
  // Throws kPeerFailure for operation `name` once broken.
  void ThrowIfBroken(const char* name) const;
};

// The peers that had not reached operation #seq at its deadline, from what they answered to a
// status query (PeerStatus; one that did not answer is late too, `silent` saying what that
// means), with a clause per rank: "rank 2 did not answer; rank 3 is at operation #7 (finished)".
struct LateRanks {
  std::vector<int> ranks;
  std::string detail;
};
LateRanks FindLateRanks(const std::vector<PeerStatus>& status, int self, uint64_t seq,
                        const char* silent);

// "<prefix>: deadline of S s (CORTADO_TIMEOUT_S) passed; rank(s) 2, 3 did not arrive (detail)",
// for a non-empty late.ranks.
std::string LateRanksMessage(const std::string& prefix, double timeout_s, const LateRanks& late);

}  // namespace cortado::dist::internal
