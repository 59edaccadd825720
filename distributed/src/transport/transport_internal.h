// Internal: what the transports (tcp/, ucx/) share beyond the Transport interface.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cortado/dist/transport.h"

namespace cortado::dist::internal {

// A posted transfer's arguments: [offset, offset + bytes) inside the region, and a peer other
// than this rank. Throws kInvalidArgument naming what is wrong.
void CheckTransfer(const MemoryRegion& region, size_t offset, size_t bytes, int peer, int rank,
                   int size);

// Whether a Wait polls before it sleeps. Polling pays when the awaited message comes within
// CommOptions::spin_us (a fast link, a reply from a peer on an idle core): it saves a wake-up.
// Over a slow link (a shaped or shared network, a large transfer) every wait ends in a sleep
// anyway, and each poll before it is CPU taken from the compute threads for nothing. So a wait
// polls only while polling pays: after `kMisses` waits in a row that polled and slept anyway, the
// following waits go straight to sleep, except every kProbe-th, which polls to find out whether
// the link got fast again (a hit resumes polling). Waits that completed at once say nothing.
class SpinPolicy {
 public:
  static constexpr int kMisses = 2;
  static constexpr uint32_t kProbe = 32;

  // Whether this wait polls before sleeping.
  bool ShouldSpin() {
    if (misses_ < kMisses) return true;
    return ++skipped_ % kProbe == 0;
  }
  // After a wait that polled: hit = it completed while polling, without sleeping.
  void Record(bool hit) {
    if (hit) {
      misses_ = 0;
      skipped_ = 0;
    } else {
      misses_ = std::min(misses_ + 1, kMisses);
    }
  }

 private:
  int misses_ = 0;
  uint32_t skipped_ = 0;
};

}  // namespace cortado::dist::internal
