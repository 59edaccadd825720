// The UCX transport (CORTADO_TRANSPORT=ucx): Cortado's collectives over UCX's tagged messages,
// so one binary uses shared memory between the ranks of a host and InfiniBand/RoCE (or TCP)
// between hosts, as UCX picks (UCX_TLS, UCX_NET_DEVICES). Built only when CMake finds libucx;
// elsewhere CreateUcxTransport throws kConfig saying so.
//
// Two planes per pair of ranks:
//   - data: a UCX endpoint (ucp_ep) per peer on one ucp_worker. Messages are ucp_tag_send/recv
//     with the sender's rank in the tag's top 12 bits (UCX matches tags from any endpoint), so
//     a receive matches the first message with its tag from that peer, as the interface asks.
//     UCX sends small messages eagerly and large ones by rendezvous (zero-copy: the receiver
//     reads straight from the sender's registered buffer, cma or RDMA); Register maps the
//     communicator's buffers once with ucp_mem_map and every transfer passes that handle.
//     Where the ranks can meet only over TCP (no RDMA device or none in UCX_TLS, and other
//     hosts or no shared memory in UCX_TLS), the transport sets UCX_RNDV_THRESH=inf itself:
//     there rendezvous handshakes queue behind the data on the link (transport/ucx/
//     eager_policy.h). A UCX_RNDV_THRESH the user set always wins. Rank 0 logs its choice, and,
//     since each rank chooses from its own environment, names the ranks when they differ (each
//     rank's choice travels in its transport address).
//   - shared memory: Allocate has ucp_mem_map allocate the memory (UCX's default order takes a
//     sysv, else posix, shared-memory segment) and register it in one call. When every rank is
//     on one host and a probe allocation maps through a peer's endpoint (ucp_rkey_ptr), every
//     rank says so in the wire-up message and SharesMemory() is true on all of them; peers then
//     map each other's allocations from their packed remote keys (ExportRegion, MapPeerRegion)
//     for the direct all-reduce. The context is created with mt_workers_shared, so memory may
//     be allocated and freed on any thread while the communicator's thread drives the worker.
//   - control: a TCP transport mesh (the same handshake, so the job token, world size and
//     fingerprint admit exactly the ranks TCP would), used for nothing but admission, status
//     queries, abort notices and noticing that a peer's process is gone (its sockets close the
//     moment it dies, while UCX's shared-memory transports may never notice). Its progress
//     thread sleeps in epoll_wait; it never touches UCX.
//
// Progress: only the calling thread drives UCX, inside Wait/Test (and Connect, Abort, the
// destructor). Wait calls ucp_worker_progress until CORTADO_SPIN_US pass without progress,
// then arms the worker (ucp_worker_arm) and sleeps in poll() on its event fd, 1 ms doubling to
// 50 ms while nothing happens (not every step of a shared-memory rendezvous signals the fd, and
// a failure seen by the control plane must be noticed). Between operations nothing polls.
// The per-message path takes no lock and allocates nothing: one thread drives the transport at
// a time (the communicator's order mutex hands it between its caller and its worker thread),
// and requests live in reused slots.
//
// Failures: endpoints to other hosts use UCX's peer error handling, and an endpoint error (peer
// gone, connection reset) fails the requests on it naming the peer and the UCX status string;
// within a host they do not (UCX 1.13's shared-memory transports cannot detect a dead peer, and
// asking for it would leave only tcp over loopback). Everywhere, a peer process that dies is
// seen by the control mesh and fails every rank's operation naming it; a stall reaches the
// deadline.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cortado/dist/env.h"
#include "cortado/dist/transport.h"

namespace cortado::dist {

// Every rank's host in rank order, given this rank's: an all-gather among the ranks creating their
// transports (the communicator runs it through its rendezvous store). A host is the address the
// rank's control mesh listens on (no port), the same one its transport address carries, so the
// eager choice and Connect agree on which ranks share a host. Throws as the exchange does
// (kTimeout naming the ranks that never answered).
using HostGather = std::function<std::vector<std::string>(const std::string& mine)>;

struct UcxTransportOptions {
  JobIdentity identity;
  int rank = 0;
  std::string control_host;  // IPv4 address the control mesh listens on (as TCP's listen_host)
  int spin_us = 50;          // CORTADO_SPIN_US: progress before sleeping on the event fd
  // Called once, before ucp_init, to learn whether every rank is on this host, which decides
  // between eager sends and UCX's default. Empty: the ranks are taken to be on one host, so only
  // a UCX_TLS without shared memory (or RDMA) makes the sends eager (rank 0 logs it when Connect
  // then finds them on several).
  HostGather gather_hosts;
};

// True when this build has the UCX transport.
bool HasUcxTransport();
// Throws kConfig when the build has no UCX, kSystem naming the UCX call and status on failure.
std::unique_ptr<Transport> CreateUcxTransport(const UcxTransportOptions& options);

}  // namespace cortado::dist
