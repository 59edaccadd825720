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
//
// "One host" has one rule, used for this choice and by the transport's Connect (which endpoints
// get UCX's peer error handling, whether the ranks probe for shared memory): two ranks are on
// one host exactly when their control meshes listen on the same address (HostOfControlAddress).
// Every rank announces that address through the store, before the UCX context for this choice
// and in its transport address for Connect. (Host names, used here before, can disagree with the
// addresses: cloned machines that kept one name, containers with their own.)
//
// Each rank decides from its own environment and devices, so ranks can differ (UCX_TLS or
// UCX_RNDV_THRESH set on some ranks only, an RDMA device on some hosts only). Every rank sends its
// decision's cause in its transport address, and rank 0 logs once, naming the ranks, when they
// did not all choose the same (DescribeDisagreement).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace cortado::dist::ucx {

struct EagerPolicyInput {
  std::optional<std::string> rndv_thresh;  // UCX_RNDV_THRESH, nullopt when unset
  std::optional<std::string> tls;          // UCX_TLS, nullopt when unset
  int rdma_devices = 0;                    // entries in /sys/class/infiniband
  bool one_host = true;                    // every rank on this host (AllOnOneHost)
};

// Why a rank chose as it did; the letter travels in the UCX transport's address.
enum class EagerCause : char {
  kUserThreshold = 'u',  // UCX_RNDV_THRESH is set: left as it says
  kRdma = 'r',           // RDMA may carry the data: UCX's default threshold
  kSharedMemory = 's',   // one host with shared memory: UCX's default threshold
  kTcpOnly = 't',        // the ranks meet only over TCP: eager sends for every size
};

struct EagerDecision {
  bool force_eager = false;  // set RNDV_THRESH=inf in the UCP config
  EagerCause cause = EagerCause::kUserThreshold;
  std::string reason;  // one line for the log, saying what was chosen and why
};

EagerDecision DecideEagerSends(const EagerPolicyInput& input);

// The cause a letter stands for; nullopt when it is none of them.
std::optional<EagerCause> ParseEagerCause(char letter);

// One line naming which ranks chose what, or "" when every rank made the same choice: eager sends
// forced, UCX's default threshold (for RDMA or for shared memory alike), or the user's
// UCX_RNDV_THRESH. by_rank[r] is rank r's cause.
std::string DescribeDisagreement(const std::vector<EagerCause>& by_rank);

// The host part of a control address ("10.0.0.5:4000" -> "10.0.0.5"; control addresses are IPv4
// host:port): what "one host" compares.
std::string HostOfControlAddress(const std::string& address);
// True when every entry is the same host (and for no entries).
bool AllOnOneHost(const std::vector<std::string>& hosts);

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
