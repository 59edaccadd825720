// Rendezvous through the store, and the choice of transport (see rendezvous.h).
#include "bootstrap/rendezvous.h"

#include "common/rank_list.h"
#include "cortado/dist/error.h"
#include "cortado/dist/tcp_transport.h"
#include "cortado/dist/ucx_transport.h"

namespace cortado::dist::internal {

std::unique_ptr<Transport> CreateTransportFor(const CommOptions& options,
                                              const JobIdentity& identity, int rank,
                                              const std::string& master_addr,
                                              const HostGather& gather_hosts) {
  const std::string host = options.socket_ifname.empty() ? RouteAddressTo(master_addr)
                                                         : InterfaceAddress(options.socket_ifname);
  if (options.transport == TransportKind::kUcx) {
    UcxTransportOptions u;
    u.identity = identity;
    u.rank = rank;
    u.control_host = host;
    u.spin_us = options.spin_us;
    u.gather_hosts = gather_hosts;
    return CreateUcxTransport(u);
  }
  TcpTransportOptions t;
  t.identity = identity;
  t.rank = rank;
  t.listen_host = host;
  t.socket_buffer_bytes = options.socket_buffer_bytes;
  t.spin_us = options.spin_us;
  return CreateTcpTransport(t);
}

std::vector<std::string> ExchangeAddresses(Store& store, const std::string& prefix, int rank,
                                           int size, const std::string& mine, Deadline deadline,
                                           std::chrono::milliseconds waited) {
  store.Set(prefix + std::to_string(rank), mine);
  std::vector<std::string> keys, addresses;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.Wait(keys, deadline);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kTimeout) throw;
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store.Check({keys[static_cast<size_t>(r)]})) missing.push_back(r);
    }
    double secs = std::chrono::duration<double>(waited).count();
    throw Error(ErrorKind::kTimeout,
                StrCat("rank ", rank, ": rank(s) ", RankList(missing),
                       " did not join the job within ", secs, " s (CORTADO_CONNECT_TIMEOUT_S)"),
                missing.empty() ? -1 : missing.front(), "rendezvous", missing);
  }
  for (const auto& k : keys) addresses.push_back(store.Get(k, deadline));
  return addresses;
}

}  // namespace cortado::dist::internal
