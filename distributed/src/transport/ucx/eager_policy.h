// Internal: whether the UCX transport forces eager sends (UCX_RNDV_THRESH=inf) for a job, decided
// before ucp_init from what the process can see, with no UCX types so it is tested without UCX.
//
// Why: over UCX's TCP transport, a large message goes by rendezvous, whose handshakes queue
// behind the data already on the link; on a slow link (100 Mbit/s) that halved the rate of
// ResNet-50's f32 all-reduces, and eager sends brought it level with Cortado's own TCP transport
// (BENCHMARKS.md, run E). Where RDMA may carry the data (rendezvous is a zero-copy RDMA read) or
// every rank shares memory on one host (a zero-copy cma read), rendezvous pays, so UCX's default
// stays.
//
// The rule: the user's UCX_RNDV_THRESH always wins. Otherwise eager for every size exactly when
//   - no RDMA path is possible: the host has no RDMA device, or UCX_TLS allows no RDMA transport
//     (rc, rc_v, rc_x, rc_verbs, rc_mlx5, ud, ud_*, dc, dc_*, ib, all), and
//   - the ranks meet over TCP: they are not all on one host, or UCX_TLS allows no shared-memory
//     transport (sm, shm, mm, posix, sysv, xpmem, cma, knem, all).
// UCX_TLS is UCX's syntax: a comma list of transports and aliases; a leading '^' excludes the
// listed ones from all; unset or empty means all.
#pragma once

#include <optional>
#include <string>

namespace cortado::dist::ucx {

struct EagerPolicyInput {
  std::optional<std::string> rndv_thresh;  // UCX_RNDV_THRESH, nullopt when unset
  std::optional<std::string> tls;          // UCX_TLS, nullopt when unset
  int rdma_devices = 0;                    // entries in /sys/class/infiniband
  bool one_host = true;                    // every rank on this host
};

struct EagerDecision {
  bool force_eager = false;  // set RNDV_THRESH=inf in the UCP config
  std::string reason;        // one line for the log, saying what was chosen and why
};

EagerDecision DecideEagerSends(const EagerPolicyInput& input);

// What UCX_TLS allows, of the kinds the rule asks about.
struct TlsReach {
  bool rdma = false;
  bool shared_memory = false;
};
TlsReach ReachOfTls(const std::optional<std::string>& tls);

// The number of entries in dir (the host's RDMA devices for /sys/class/infiniband); 0 when it
// does not exist.
int CountRdmaDevices(const std::string& dir = "/sys/class/infiniband");

}  // namespace cortado::dist::ucx
