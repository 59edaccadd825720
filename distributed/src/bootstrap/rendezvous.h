// Internal: how the ranks of a communicator find each other, shared by every transport. Each
// rank builds the transport CommOptions::transport names, publishes its LocalAddress() under
// prefix + rank in the store, waits for everyone's, and hands the list to Transport::Connect.
// The job identity (token, world size, fingerprint) is checked by each connection's handshake
// (internal::HelloRejection in transport/tcp/frames.h): the TCP transport does it on its own
// sockets, the UCX transport on the TCP control mesh it keeps beside its UCX endpoints, so both
// admit exactly the same ranks.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cortado/dist/env.h"
#include "cortado/dist/store.h"
#include "cortado/dist/transport.h"
#include "cortado/dist/ucx_transport.h"

namespace cortado::dist::internal {

// The transport of options.transport for this rank, listening where master_addr is reachable
// (or on CORTADO_SOCKET_IFNAME). Throws kConfig when UCX is asked for but not built. The UCX
// transport calls gather_hosts (every rank's host, its control address) before it creates its
// UCX context.
std::unique_ptr<Transport> CreateTransportFor(const CommOptions& options,
                                              const JobIdentity& identity, int rank,
                                              const std::string& master_addr,
                                              const HostGather& gather_hosts);

// Publishes `mine` as prefix + rank and returns every rank's address, in rank order. A rank that
// never publishes makes it throw kTimeout naming the missing ranks (waited: the connect timeout,
// for the message).
std::vector<std::string> ExchangeAddresses(Store& store, const std::string& prefix, int rank,
                                           int size, const std::string& mine, Deadline deadline,
                                           std::chrono::milliseconds waited);

}  // namespace cortado::dist::internal
