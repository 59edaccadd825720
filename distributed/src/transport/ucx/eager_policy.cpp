// The UCX transport's choice between eager sends and UCX's rendezvous (see eager_policy.h).
#include "transport/ucx/eager_policy.h"

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <vector>

namespace cortado::dist::ucx {
namespace {

// The UCX transports the rule asks about, one bit each; every other one (tcp, self, cuda_*, ...)
// counts for neither.
enum : uint32_t {
  kRcVerbs = 1u << 0,
  kRcMlx5 = 1u << 1,
  kUdVerbs = 1u << 2,
  kUdMlx5 = 1u << 3,
  kDcMlx5 = 1u << 4,
  kPosix = 1u << 5,
  kSysv = 1u << 6,
  kXpmem = 1u << 7,
  kCma = 1u << 8,
  kKnem = 1u << 9,
};
constexpr uint32_t kRc = kRcVerbs | kRcMlx5;
constexpr uint32_t kUd = kUdVerbs | kUdMlx5;
constexpr uint32_t kRdma = kRc | kUd | kDcMlx5;
constexpr uint32_t kMm = kPosix | kSysv | kXpmem;
constexpr uint32_t kSharedMemory = kMm | kCma | kKnem;
constexpr uint32_t kAll = kRdma | kSharedMemory;

// The transports one UCX_TLS entry (a name or an alias, lower case) stands for.
uint32_t KindsOf(std::string_view name) {
  struct Entry {
    std::string_view name;
    uint32_t kinds;
  };
  static constexpr Entry kNames[] = {
      {"all", kAll},
      {"ib", kRdma},
      {"rc", kRc},
      {"rc_v", kRcVerbs},
      {"rc_verbs", kRcVerbs},
      {"rc_x", kRcMlx5},
      {"rc_mlx5", kRcMlx5},
      {"ud", kUd},
      {"ud_v", kUdVerbs},
      {"ud_verbs", kUdVerbs},
      {"ud_x", kUdMlx5},
      {"ud_mlx5", kUdMlx5},
      {"dc", kDcMlx5},
      {"dc_x", kDcMlx5},
      {"dc_mlx5", kDcMlx5},
      {"sm", kSharedMemory},
      {"shm", kSharedMemory},
      {"mm", kMm},
      {"posix", kPosix},
      {"sysv", kSysv},
      {"xpmem", kXpmem},
      {"cma", kCma},
      {"knem", kKnem},
  };
  for (const auto& e : kNames) {
    if (e.name == name) return e.kinds;
  }
  // Other spellings of the unreliable- and dynamic-datagram families (ud_*, dc_*) are still RDMA.
  if (name.starts_with("ud")) return kUd;
  if (name.starts_with("dc")) return kDcMlx5;
  return 0;
}

// The transports UCX_TLS allows (unset or empty: all of them).
uint32_t AllowedKinds(const std::optional<std::string>& tls) {
  if (!tls || tls->empty()) return kAll;
  std::string_view list = *tls;
  const bool exclude = list.front() == '^';
  if (exclude) list.remove_prefix(1);
  uint32_t named = 0;
  while (true) {
    const size_t comma = list.find(',');
    std::string name;
    for (char c : list.substr(0, comma)) {
      if (!std::isspace(static_cast<unsigned char>(c))) {
        name.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
      }
    }
    named |= KindsOf(name);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return exclude ? kAll & ~named : named;
}

std::string TlsText(const std::optional<std::string>& tls) {
  return tls ? "UCX_TLS=" + *tls : "UCX_TLS (unset: all)";
}

constexpr const char* kOverride = "set UCX_RNDV_THRESH to choose otherwise";

}  // namespace

TlsReach ReachOfTls(const std::optional<std::string>& tls) {
  const uint32_t allowed = AllowedKinds(tls);
  return TlsReach{(allowed & kRdma) != 0, (allowed & kSharedMemory) != 0};
}

EagerDecision DecideEagerSends(const EagerPolicyInput& in) {
  if (in.rndv_thresh) {
    return {false, EagerCause::kUserThreshold,
            "UCX_RNDV_THRESH=" + *in.rndv_thresh +
                " is set; the rendezvous threshold is left as it says"};
  }
  const TlsReach reach = ReachOfTls(in.tls);
  if (in.rdma_devices > 0 && reach.rdma) {
    return {false, EagerCause::kRdma,
            "an RDMA device (" + std::to_string(in.rdma_devices) +
                " in /sys/class/infiniband) and " + TlsText(in.tls) +
                " allows RDMA; UCX's default rendezvous threshold (" + kOverride + ")"};
  }
  if (in.one_host && reach.shared_memory) {
    return {false, EagerCause::kSharedMemory,
            "every rank on one host, and " + TlsText(in.tls) +
                " allows shared memory; UCX's default rendezvous threshold (zero-copy "
                "cma reads; " +
                kOverride + ")"};
  }
  const std::string no_rdma =
      in.rdma_devices == 0 ? "no RDMA device" : TlsText(in.tls) + " allows no RDMA transport";
  const std::string over_tcp =
      !in.one_host ? "ranks on more than one host" : TlsText(in.tls) + " allows no shared memory";
  return {true, EagerCause::kTcpOnly,
          "peers reachable only over TCP (" + no_rdma + "; " + over_tcp +
              "); eager sends for every size (" + kOverride + ")"};
}

std::optional<EagerCause> ParseEagerCause(char letter) {
  for (EagerCause c : {EagerCause::kUserThreshold, EagerCause::kRdma, EagerCause::kSharedMemory,
                       EagerCause::kTcpOnly}) {
    if (static_cast<char>(c) == letter) return c;
  }
  return std::nullopt;
}

std::string DescribeDisagreement(const std::vector<EagerCause>& by_rank) {
  // The choice each cause makes: RDMA and shared memory both leave UCX's default in place.
  auto choice = [](EagerCause c) { return c == EagerCause::kSharedMemory ? EagerCause::kRdma : c; };
  bool same = true;
  for (EagerCause c : by_rank) same &= choice(c) == choice(by_rank.front());
  if (same) return {};
  // One group per cause, in a fixed order, each naming its ranks.
  struct Group {
    EagerCause cause;
    const char* says;
  };
  static constexpr Group kGroups[] = {
      {EagerCause::kTcpOnly, "force eager sends for every size (peers reachable only over TCP)"},
      {EagerCause::kRdma, "keep UCX's default rendezvous threshold (an RDMA path)"},
      {EagerCause::kSharedMemory,
       "keep UCX's default rendezvous threshold (one host with shared memory)"},
      {EagerCause::kUserThreshold, "use the UCX_RNDV_THRESH set for them"},
  };
  std::string groups;
  for (const Group& g : kGroups) {
    std::string ranks;
    for (size_t r = 0; r < by_rank.size(); ++r) {
      if (by_rank[r] == g.cause) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (ranks.empty()) continue;
    groups += (groups.empty() ? "" : "; ") + std::string("rank(s) ") + ranks + " " + g.says;
  }
  return "the ranks chose differently between eager sends and rendezvous: " + groups +
         " (each rank decides from its own UCX_RNDV_THRESH, UCX_TLS and RDMA devices: set them "
         "alike on every rank for one choice)";
}

std::string HostOfControlAddress(const std::string& address) {
  return address.substr(0, address.rfind(':'));
}

bool AllOnOneHost(const std::vector<std::string>& hosts) {
  for (const std::string& h : hosts) {
    if (h != hosts.front()) return false;
  }
  return true;
}

int CountRdmaDevices(const std::string& dir) {
  // Errors (no such directory, unreadable) count as no device: nothing then forces RDMA.
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n;
}

}  // namespace cortado::dist::ucx
