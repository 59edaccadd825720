// The TCP transport (CORTADO_TRANSPORT=tcp, the default): its options and factory, and the
// address helpers the communicator uses to pick the interface it listens on. The transport
// itself lives in src/transport/tcp/; see transport.h for the interface it implements.
#pragma once

#include <memory>
#include <string>

#include "cortado/dist/env.h"
#include "cortado/dist/transport.h"

namespace cortado::dist {

struct TcpTransportOptions {
  JobIdentity identity;
  int rank = 0;
  std::string listen_host;  // IPv4 address to bind and publish; empty: see CreateTcpTransport
  int socket_buffer_bytes = 0;
  int spin_us = 50;
};

// Listens on listen_host (or the address of CORTADO_SOCKET_IFNAME resolved by the caller).
std::unique_ptr<Transport> CreateTcpTransport(const TcpTransportOptions& options);

// The IPv4 address of a network interface ("eth0"); throws kConfig listing the interfaces.
std::string InterfaceAddress(const std::string& ifname);
// The local IPv4 address used to reach host (127.0.0.1 for a loopback host).
std::string RouteAddressTo(const std::string& host);

}  // namespace cortado::dist
