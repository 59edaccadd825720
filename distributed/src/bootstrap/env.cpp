// Launch environment discovery, job tokens and CommOptions::FromEnv. See env.h for the order of
// precedence; every variable read here is listed in distributed/README.md.
#include "cortado/dist/env.h"

#include <cctype>
#include <cstdlib>
#include <limits>

#include "common/names.h"
#include "cortado/dist/error.h"

namespace cortado::dist {
namespace {

std::optional<std::string> Get(const EnvLookup& env, const std::string& name) {
  auto value = env(name);
  if (value && value->empty()) return std::nullopt;
  return value;
}

int64_t ParseInt(const std::string& name, const std::string& text, int64_t lo, int64_t hi) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < lo || v > hi) {
    Fail(ErrorKind::kConfig, name, "='", text, "' is not an integer in [", lo, ", ", hi, "]");
  }
  return v;
}

double ParseDouble(const std::string& name, const std::string& text, double lo) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !(v >= lo)) {
    Fail(ErrorKind::kConfig, name, "='", text, "' is not a number >= ", lo);
  }
  return v;
}

int GetInt(const EnvLookup& env, const std::string& name, int lo, int hi, int fallback) {
  auto text = Get(env, name);
  return text ? static_cast<int>(ParseInt(name, *text, lo, hi)) : fallback;
}

std::chrono::milliseconds GetSeconds(const EnvLookup& env, const std::string& name,
                                     std::chrono::milliseconds fallback) {
  auto text = Get(env, name);
  if (!text) return fallback;
  double s = ParseDouble(name, *text, 0.001);
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0 + 0.5));
}

// The first host of a Slurm host list: "node[01-04,07],gpu5" -> "node01".
std::string FirstSlurmHost(const std::string& list) {
  std::string host;
  size_t i = 0;
  while (i < list.size() && list[i] != ',' && list[i] != '[') host += list[i++];
  if (i < list.size() && list[i] == '[') {
    ++i;
    while (i < list.size() && (std::isdigit(static_cast<unsigned char>(list[i]))))
      host += list[i++];
  }
  return host;
}

// A port in [20000, 32768) derived from a job id, for launchers that do not pick one. It stays
// below Linux's ephemeral range (32768-60999 by default), where any process's outgoing
// connection may hold the port when rank 0 comes to listen on it.
int DerivedPort(const std::string& job_id) {
  return 20000 + static_cast<int>(Fingerprint(job_id) % 12768);
}

struct Family {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

// The launchers whose variables say this process's place, in order of precedence.
constexpr Family kFamilies[] = {
    {"cortado", "CORTADO_RANK", "CORTADO_WORLD_SIZE", "CORTADO_LOCAL_RANK",
     "CORTADO_LOCAL_WORLD_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

// Rank, world size, local rank and local world size from a family's variables.
void ReadPlace(const EnvLookup& env, const Family& family, LaunchInfo* info) {
  const int kMaxRanks = 1 << 20;
  auto size_text = Get(env, family.size);
  if (!size_text) {
    Fail(ErrorKind::kConfig, family.rank, " is set but ", family.size,
         " is not; set both (or neither)");
  }
  info->world_size = static_cast<int>(ParseInt(family.size, *size_text, 1, kMaxRanks));
  info->rank =
      static_cast<int>(ParseInt(family.rank, *Get(env, family.rank), 0, info->world_size - 1));
  info->local_rank = GetInt(env, family.local_rank, 0, kMaxRanks, info->rank);
  if (auto local_size = Get(env, family.local_size)) {
    // Slurm writes "2(x3)" for heterogeneous layouts: the leading number is ours.
    std::string digits;
    for (char c : *local_size) {
      if (!std::isdigit(static_cast<unsigned char>(c))) break;
      digits += c;
    }
    info->local_world_size = static_cast<int>(
        ParseInt(family.local_size, digits.empty() ? *local_size : digits, 1, kMaxRanks));
  } else {
    info->local_world_size = info->world_size;
  }
}

// Master address and port: Cortado's, then torchrun's, then launcher-specific defaults (Slurm's
// first node; under mpirun or Slurm a port derived from the job token).
void ReadMaster(const EnvLookup& env, const std::optional<std::string>& token, LaunchInfo* info) {
  const std::string source = info->source;
  auto addr = Get(env, "CORTADO_MASTER_ADDR");
  auto port = Get(env, "CORTADO_MASTER_PORT");
  const char* port_name = "CORTADO_MASTER_PORT";
  if (!addr) addr = Get(env, "MASTER_ADDR");
  if (!port) {
    port = Get(env, "MASTER_PORT");
    port_name = "MASTER_PORT";
  }
  if (addr) info->master_addr = *addr;
  if (port) info->master_port = static_cast<int>(ParseInt(port_name, *port, 1, 65535));
  if (source == "slurm" && !addr) {
    if (auto nodes = Get(env, "SLURM_JOB_NODELIST")) info->master_addr = FirstSlurmHost(*nodes);
  }
  if ((source == "mpirun" || source == "slurm") && !port && token) {
    info->master_port = DerivedPort(*token);
  }
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

uint64_t Fingerprint(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::optional<std::string> FindJobToken(const EnvLookup& env) {
  if (auto t = Get(env, "CORTADO_JOB_TOKEN")) return *t;
  if (auto job = Get(env, "SLURM_JOB_ID")) {
    return "slurm:" + *job + "." + Get(env, "SLURM_STEP_ID").value_or("0");
  }
  if (auto ns = Get(env, "PMIX_NAMESPACE")) return "pmix:" + *ns;
  if (auto job = Get(env, "OMPI_MCA_ess_base_jobid")) return "ompi:" + *job;
  if (auto run = Get(env, "TORCHELASTIC_RUN_ID")) return "torchelastic:" + *run;
  return std::nullopt;
}

LaunchInfo DiscoverLaunchInfo(const EnvLookup& env) {
  LaunchInfo info;
  const Family* family = nullptr;
  for (const Family& f : kFamilies) {
    if (Get(env, f.rank)) {
      family = &f;
      break;
    }
  }
  if (!family) return info;  // rank 0 of 1
  info.source = family->source;
  ReadPlace(env, *family, &info);
  const std::optional<std::string> token = FindJobToken(env);
  ReadMaster(env, token, &info);
  if (auto fd = Get(env, "CORTADO_STORE_FD"); fd && info.rank == 0) {
    info.store_fd = static_cast<int>(ParseInt("CORTADO_STORE_FD", *fd, 0, 1 << 20));
  }
  if (info.world_size > 1) {
    if (!token) {
      Fail(ErrorKind::kConfig,
           "no job token: set CORTADO_JOB_TOKEN to the same value on every rank (`cortado "
           "launch` sets it; Slurm, PMIx/Open MPI and torchrun job ids are used when present)");
    }
    info.job_token = *token;
    if (info.master_port == 0) {
      Fail(ErrorKind::kConfig, "no master port for a ", info.world_size, "-rank job (", info.source,
           " environment): set CORTADO_MASTER_PORT (or MASTER_PORT)");
    }
  } else if (token) {
    info.job_token = *token;
  }
  return info;
}

namespace {

// CORTADO_BACKEND's "tcp" is its name from before CORTADO_TRANSPORT existed.
constexpr internal::Spelling<Backend> kBackendNames[] = {
    {Backend::kCortado, "cortado"}, {Backend::kMpi, "mpi"}, {Backend::kCortado, "tcp"}};
constexpr internal::Spelling<TransportKind> kTransportNames[] = {{TransportKind::kTcp, "tcp"},
                                                                 {TransportKind::kUcx, "ucx"}};
constexpr internal::Spelling<Algorithm> kAlgorithmNames[] = {
    {Algorithm::kAuto, "auto"},
    {Algorithm::kRing, "ring"},
    {Algorithm::kHalvingDoubling, "halving_doubling"},
    {Algorithm::kTree, "tree"},
    {Algorithm::kDirect, "direct"},
    {Algorithm::kRing, "chain"},
    {Algorithm::kHalvingDoubling, "hd"},
    {Algorithm::kHalvingDoubling, "rhd"},
    {Algorithm::kTree, "binomial"}};

}  // namespace

const char* BackendName(Backend backend) { return internal::NameOf(kBackendNames, backend); }

const char* TransportKindName(TransportKind kind) {
  return internal::NameOf(kTransportNames, kind);
}

TransportKind ParseTransportKind(const std::string& name) {
  if (auto kind = internal::FindName(kTransportNames, name)) return *kind;
  Fail(ErrorKind::kConfig, "transport '", name,
       "' is not one of: ", internal::KnownNames(kTransportNames));
}

const char* AlgorithmName(Algorithm algo) { return internal::NameOf(kAlgorithmNames, algo); }

Algorithm ParseAlgorithm(const std::string& name) {
  if (auto algo = internal::FindName(kAlgorithmNames, name)) return *algo;
  Fail(ErrorKind::kInvalidArgument, "unknown algorithm '", name,
       "' (known: auto, ring, halving_doubling (hd), tree, direct)");
}

size_t ParseByteSize(const std::string& text) {
  if (text.empty()) Fail(ErrorKind::kInvalidArgument, "empty byte size");
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used, 10);
  } catch (const std::exception&) {
    Fail(ErrorKind::kInvalidArgument, "'", text, "' is not a byte size (e.g. 4096, 4K, 64M, 1G)");
  }
  std::string suffix = text.substr(used);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix == "B") suffix.clear();
  if (!suffix.empty() && suffix.back() == 'B') suffix.pop_back();
  if (!suffix.empty() && suffix.back() == 'I') suffix.pop_back();  // "KiB"
  unsigned shift = 0;
  if (suffix == "K") {
    shift = 10;
  } else if (suffix == "M") {
    shift = 20;
  } else if (suffix == "G") {
    shift = 30;
  } else if (!suffix.empty()) {
    Fail(ErrorKind::kInvalidArgument, "'", text, "' is not a byte size (e.g. 4096, 4K, 64M, 1G)");
  }
  if (v > (std::numeric_limits<size_t>::max() >> shift)) {
    Fail(ErrorKind::kInvalidArgument, "byte size '", text, "' is too large");
  }
  return static_cast<size_t>(v) << shift;
}

std::string FormatByteSize(size_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) return StrCat(bytes >> 30, "G");
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) return StrCat(bytes >> 20, "M");
  if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0) return StrCat(bytes >> 10, "K");
  return StrCat(bytes);
}

CommOptions CommOptions::FromEnv(const EnvLookup& env) {
  CommOptions o;
  o.timeout = GetSeconds(env, "CORTADO_TIMEOUT_S", o.timeout);
  o.connect_timeout = GetSeconds(env, "CORTADO_CONNECT_TIMEOUT_S", o.connect_timeout);
  if (auto b = Get(env, "CORTADO_BACKEND")) {
    if (*b == "ucx") {
      Fail(ErrorKind::kConfig,
           "CORTADO_BACKEND='ucx': UCX is a transport under Cortado's collectives; set "
           "CORTADO_TRANSPORT=ucx (CORTADO_BACKEND is cortado or mpi)");
    }
    auto backend = internal::FindName(kBackendNames, *b);
    if (!backend) {
      Fail(ErrorKind::kConfig, "CORTADO_BACKEND='", *b,
           "' is not one of: ", internal::KnownNames(kBackendNames));
    }
    o.backend = *backend;
  }
  if (auto t = Get(env, "CORTADO_TRANSPORT")) {
    auto transport = internal::FindName(kTransportNames, *t);
    if (!transport) {
      Fail(ErrorKind::kConfig, "CORTADO_TRANSPORT='", *t,
           "' is not one of: ", internal::KnownNames(kTransportNames));
    }
    o.transport = *transport;
  }
  if (auto s = Get(env, "CORTADO_SOCKET_IFNAME")) o.socket_ifname = *s;
  if (auto a = Get(env, "CORTADO_ALLREDUCE_ALGO")) {
    try {
      o.allreduce_algorithm = ParseAlgorithm(*a);
    } catch (const Error& e) {
      Fail(ErrorKind::kConfig, "CORTADO_ALLREDUCE_ALGO: ", e.what());
    }
    if (o.allreduce_algorithm == Algorithm::kTree) {
      Fail(ErrorKind::kConfig, "CORTADO_ALLREDUCE_ALGO='", *a,
           "': all-reduce algorithms are auto, ring, halving_doubling, direct");
    }
  }
  auto bytes = [&](const char* name, size_t fallback) {
    auto text = Get(env, name);
    if (!text) return fallback;
    try {
      return ParseByteSize(*text);
    } catch (const Error& e) {
      Fail(ErrorKind::kConfig, name, ": ", e.what());
    }
  };
  o.allreduce_small_bytes = bytes("CORTADO_ALLREDUCE_SMALL_BYTES", o.allreduce_small_bytes);
  o.broadcast_small_bytes = bytes("CORTADO_BROADCAST_SMALL_BYTES", o.broadcast_small_bytes);
  o.chunk_bytes = bytes("CORTADO_CHUNK_BYTES", o.chunk_bytes);
  if (o.chunk_bytes < 4096) Fail(ErrorKind::kConfig, "CORTADO_CHUNK_BYTES must be at least 4K");
  o.pipeline_depth = GetInt(env, "CORTADO_PIPELINE_DEPTH", 1, 64, o.pipeline_depth);
  {
    // setsockopt takes an int; the kernel caps it further (net.core.wmem_max, rmem_max).
    const size_t socket_buffer =
        bytes("CORTADO_SOCKET_BUFFER", static_cast<size_t>(o.socket_buffer_bytes));
    constexpr size_t kMax = size_t{1} << 30;
    if (socket_buffer > kMax) {
      Fail(ErrorKind::kConfig, "CORTADO_SOCKET_BUFFER: ", socket_buffer,
           " bytes is more than the largest socket buffer, 1G");
    }
    o.socket_buffer_bytes = static_cast<int>(socket_buffer);
  }
  o.spin_us = GetInt(env, "CORTADO_SPIN_US", 0, 1000000, o.spin_us);
  return o;
}

}  // namespace cortado::dist
