// The UCX transport (see cortado/dist/ucx_transport.h for the design: a UCX data plane and a TCP
// control plane; progress on the calling thread only).
#include "cortado/dist/ucx_transport.h"

#include <poll.h>
#include <sched.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

#include "cortado/dist/error.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport_internal.h"
#include "transport/ucx/eager_policy.h"
#include "transport/ucx/wait_pacer.h"

namespace cortado::dist {
namespace ucx {
namespace {

// Tag layout on the wire: [63..52] the sender's rank, [51..0] the low bits of the collective's
// tag (its sequence number modulo 4096 in the top bits: operations run one at a time, and UCX
// matches in arrival order per endpoint, so a wrapped sequence number cannot match early).
constexpr int kRankShift = 52;
constexpr int kMaxRanks = 1 << (64 - kRankShift);
constexpr uint64_t kTagMask = (uint64_t{1} << kRankShift) - 1;
constexpr uint64_t kFullMask = ~uint64_t{0};
// The tag of the wire-up message Connect exchanges with every peer (no collective uses step
// 0xffff with chunk 0xffffff).
constexpr uint64_t kWireupTag = kTagMask;
// How long a failed UCX request waits for the control plane to name a root cause (an abort
// notice arrives just before the aborting process closes its endpoints).
constexpr auto kRootCauseGrace = std::chrono::milliseconds(200);

uint64_t WireTag(int sender, uint64_t tag) {
  return (static_cast<uint64_t>(sender) << kRankShift) | (tag & kTagMask);
}

std::string Hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[p[i] >> 4]);
    out.push_back(digits[p[i] & 15]);
  }
  return out;
}

std::string Unhex(const std::string& text) {
  auto value = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    Fail(ErrorKind::kProtocol, "malformed UCX worker address (not hex)");
  };
  if (text.size() % 2) Fail(ErrorKind::kProtocol, "malformed UCX worker address (odd length)");
  std::string out(text.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(value(text[2 * i]) << 4 | value(text[2 * i + 1]));
  }
  return out;
}

std::optional<std::string> EnvValue(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// Eager sends or UCX's default (see eager_policy.h), from the UCX_* variables, this host's RDMA
// devices and whether every rank is on one host.
EagerDecision ChooseEagerSends(bool one_host) {
  EagerPolicyInput in;
  in.rndv_thresh = EnvValue("UCX_RNDV_THRESH");
  in.tls = EnvValue("UCX_TLS");
  in.rdma_devices = CountRdmaDevices();
  in.one_host = one_host;
  return DecideEagerSends(in);
}

void Check(ucs_status_t status, const char* call) {
  if (status != UCS_OK) {
    Fail(ErrorKind::kSystem, "UCX ", call, " failed: ", ucs_status_string(status));
  }
}

// The UCP context, shared by the transport and its regions: a communicator may free its
// registered buffers after the transport, and ucp_mem_unmap needs the context alive.
struct Context {
  ucp_context_h handle = nullptr;
  ~Context() {
    if (handle) ucp_cleanup(handle);
  }
};

// Memory mapped with ucp_mem_map: a caller's buffer (Register) or memory UCX allocated for it
// (Allocate: with UCX's default allocation order, shared memory from the sysv or posix memory
// domain, which peers on the host can map; owned, and freed by ucp_mem_unmap).
class UcxRegion final : public MemoryRegion {
 public:
  // Registers [data, data + size) of the caller's memory.
  UcxRegion(void* data, size_t size, std::shared_ptr<Context> context)
      : MemoryRegion(data, size), context_(std::move(context)) {
    if (size == 0) return;
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = data;
    p.length = size;
    // A region UCX cannot map (no memory domain wants it) still works, unregistered.
    if (ucp_mem_map(context_->handle, &p, &memh_) != UCS_OK) memh_ = nullptr;
  }
  // Takes over memory ucp_mem_map allocated (see Allocate).
  UcxRegion(void* data, size_t size, std::shared_ptr<Context> context, ucp_mem_h memh)
      : MemoryRegion(data, size), context_(std::move(context)), memh_(memh), owned_(true) {}
  ~UcxRegion() override {
    if (memh_) ucp_mem_unmap(context_->handle, memh_);
  }
  ucp_mem_h memh() const { return memh_; }
  bool owned() const { return owned_; }

  // ExportRegion's answer, worked out once per region (see there).
  mutable std::optional<std::string> exported;

 private:
  std::shared_ptr<Context> context_;
  ucp_mem_h memh_ = nullptr;
  bool owned_ = false;
};

// A peer's region mapped here through its remote key (ucp_rkey_ptr: the shared-memory segment
// attached into this process); detached when the key is destroyed.
class UcxPeerMemory final : public PeerMemory {
 public:
  UcxPeerMemory(char* data, ucp_rkey_h rkey) : PeerMemory(data), rkey_(rkey) {}
  ~UcxPeerMemory() override { ucp_rkey_destroy(rkey_); }

 private:
  ucp_rkey_h rkey_;
};

struct Request {
  bool in_use = false;
  uint32_t generation = 0;  // bumped at each reuse of the slot, so a stale id is caught
  int peer = -1;
  bool send = false;
  bool done = false;
  ucs_status_t status = UCS_OK;
  size_t expected = 0;  // receives: the length the message must have
  size_t received = 0;
  void* handle = nullptr;  // UCX's request while in flight
};

class UcxTransport;

struct Peer {
  UcxTransport* transport = nullptr;
  int rank = -1;
  ucp_ep_h ep = nullptr;
  ucs_status_t error = UCS_OK;  // set by the endpoint error handler
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const UcxTransportOptions& options);
  ~UcxTransport() override;

  const char* name() const override { return "ucx"; }
  // "control|worker|cause": the control mesh's address, the UCX worker's (hex) and the letter of
  // this rank's eager choice (EagerCause), which rank 0 compares across the ranks in Connect.
  std::string LocalAddress() const override {
    return control_->LocalAddress() + "|" + Hex(address_.data(), address_.size()) + "|" +
           static_cast<char>(eager_cause_);
  }
  void Connect(const std::vector<std::string>& addresses, Deadline deadline) override;
  std::unique_ptr<MemoryRegion> Register(void* data, size_t bytes) override {
    return std::make_unique<UcxRegion>(data, bytes, context_holder_);
  }
  std::unique_ptr<MemoryRegion> Allocate(size_t bytes) override;
  bool SharesMemory() const override { return shares_memory_; }
  std::string ExportRegion(const MemoryRegion& region) override;
  std::unique_ptr<PeerMemory> MapPeerRegion(int peer, const std::string& exported,
                                            uint64_t remote_data, size_t bytes) override;
  RequestId PostSend(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                     uint64_t tag) override;
  RequestId PostRecv(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                     uint64_t tag) override;
  bool Test(RequestId id) override;
  void Wait(RequestId id, Deadline deadline) override;
  void BeginOperation(uint64_t seq) override {
    started_ = seq;
    control_->ReportOperations(started_, finished_);
  }
  void EndOperation(uint64_t seq) override {
    finished_ = seq;
    control_->ReportOperations(started_, finished_);
  }
  std::vector<PeerStatus> QueryStatus(Deadline deadline) override {
    return control_->QueryStatus(deadline);
  }
  void Abort(int root_rank, const std::string& reason) override;
  void CheckHealthy() override;
  uint64_t WaitSleeps() const override { return wait_sleeps_.load(std::memory_order_relaxed); }

 private:
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnSend(void* request, ucs_status_t status, void* user_data);
  static void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                     void* user_data);

  // PostSend and PostRecv: they differ only in the UCX call.
  RequestId Post(bool send, int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                 uint64_t tag);
  static void Complete(Request& r, ucs_status_t status);
  // Progress until nothing more happens; true when something did.
  bool ProgressAll() { return ucp_worker_progress(worker_) != 0; }
  // Sleeps on the worker's event fd up to timeout_ms, unless events are pending already (then
  // returns false at once).
  bool Sleep(int timeout_ms);
  [[noreturn]] void ThrowFailed(const Request& r);
  // Rank 0, once per process: the ranks' eager choices where they differ, and a choice made for
  // one host where the ranks turned out to be on several (no host exchange).
  void ReportChoices(const std::vector<EagerCause>& causes, const std::vector<std::string>& hosts);
  std::string Describe(const Request& r) const;
  // Maps `exported` through the endpoint to peer; null (status in *status) when UCX cannot.
  std::unique_ptr<UcxPeerMemory> TryMap(int peer, const std::string& exported, uint64_t remote_data,
                                        ucs_status_t* status);
  // Request slots: a free list over slots that never move (UCX callbacks hold Request*), so a
  // message costs no allocation. An id is (generation << 32) | (slot + 1).
  Request& NewRequest(RequestId* id);
  Request& Find(RequestId id);
  void Release(Request& r, RequestId id);
  template <typename F>
  void ForEachRequest(F f) {
    for (auto& r : slots_) {
      if (r->in_use) f(*r);
    }
  }

  int spin_us_;
  std::unique_ptr<tcp::TcpTransport> control_;
  std::shared_ptr<Context> context_holder_ = std::make_shared<Context>();
  ucp_context_h context_ = nullptr;  // context_holder_->handle
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::string address_;
  // Every rank's host (HostOfControlAddress) as gathered before ucp_init for the eager choice;
  // empty without UcxTransportOptions::gather_hosts (the choice then took one host).
  std::vector<std::string> gathered_hosts_;
  EagerCause eager_cause_ = EagerCause::kUserThreshold;
  std::vector<Peer> peers_;
  bool connected_ = false;
  bool shares_memory_ = false;  // decided in Connect, the same on every rank
  bool aborted_ = false;
  std::string abort_reason_;
  int abort_rank_ = -1;
  // No mutex: one thread drives the transport at a time (the Transport contract). The
  // communicator's worker thread and its caller take turns under the communicator's order
  // mutex, which orders their UCX calls (the worker is THREAD_MODE_SERIALIZED).
  std::vector<std::unique_ptr<Request>> slots_;
  std::vector<uint32_t> free_slots_;
  uint64_t started_ = 0;
  uint64_t finished_ = 0;
  internal::SpinPolicy spin_policy_;  // whether Wait polls for spin_us before it sleeps
  std::atomic<uint64_t> wait_sleeps_{0};
};

UcxTransport::UcxTransport(const UcxTransportOptions& options)
    : Transport(options.rank, options.identity.world_size), spin_us_(options.spin_us) {
  if (size() < 1 || rank() < 0 || rank() >= size()) {
    Fail(ErrorKind::kInvalidArgument, "ucx transport: rank ", rank(), " outside world of ", size());
  }
  if (size() > kMaxRanks) {
    Fail(ErrorKind::kConfig, "ucx transport: ", size(), " ranks; the tag layout allows ",
         kMaxRanks);
  }
  TcpTransportOptions c;
  c.identity = options.identity;
  c.rank = rank();
  c.listen_host = options.control_host;
  c.spin_us = 0;  // the control plane is never waited on in a hot loop
  control_ = std::make_unique<tcp::TcpTransport>(c);

  // Before the config is read, so a failed exchange leaks nothing. The host each rank announces
  // is the one its transport address carries, so Connect sees the same hosts (eager_policy.h).
  if (options.gather_hosts) {
    gathered_hosts_ = options.gather_hosts(HostOfControlAddress(control_->LocalAddress()));
  }
  const EagerDecision eager = ChooseEagerSends(AllOnOneHost(gathered_hosts_));
  eager_cause_ = eager.cause;
  ucp_config_t* config = nullptr;
  Check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");  // UCX_* variables
  if (eager.force_eager) {
    const ucs_status_t m = ucp_config_modify(config, "RNDV_THRESH", "inf");
    if (m != UCS_OK) ucp_config_release(config);
    Check(m, "ucp_config_modify RNDV_THRESH=inf");
  }
  // One line per process, from rank 0 (a communicator's Split makes more transports).
  static std::atomic<bool> logged{false};
  if (rank() == 0 && !logged.exchange(true)) {
    std::fprintf(stderr, "cortado: ucx transport: %s\n", eager.reason.c_str());
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  // Context-level calls are locked: memory is allocated, registered and freed (ucp_mem_map,
  // ucp_mem_unmap) on whichever thread owns a buffer, while the communicator's thread drives
  // the worker.
  params.mt_workers_shared = 1;
  ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  Check(s, "ucp_init");
  context_holder_->handle = context_;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  s = ucp_worker_create(context_, &wp, &worker_);
  Check(s, "ucp_worker_create");
  ucp_address_t* address = nullptr;
  size_t length = 0;
  s = ucp_worker_get_address(worker_, &address, &length);
  if (s == UCS_OK) {
    address_.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
    s = ucp_worker_get_efd(worker_, &event_fd_);
  }
  if (s != UCS_OK) {
    ucp_worker_destroy(worker_);
    Check(s, "ucp_worker_get_address/get_efd");
  }
  peers_.resize(static_cast<size_t>(size()));
}

UcxTransport::~UcxTransport() {
  // Flush first, so messages this rank sent eagerly (complete here, maybe not yet there) reach
  // their peers; bounded, since a dead peer never acknowledges. Then close every endpoint by
  // force: a flush-mode close would wait for the peer to progress, and it may be computing, or
  // gone. A peer sees our endpoint fail afterwards, which fails only requests to this rank, and
  // there are none (every request is waited) unless it is itself failing.
  auto wait_for = [&](ucs_status_ptr_t r, Deadline bound) {
    if (!UCS_PTR_IS_PTR(r)) return;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && !bound.Expired()) {
      if (!ProgressAll()) Sleep(5);
    }
    ucp_request_free(r);
  };
  if (connected_ && !aborted_) {
    ucp_request_param_t param{};
    wait_for(ucp_worker_flush_nbx(worker_, &param), Deadline::After(std::chrono::seconds(2)));
  }
  for (auto& p : peers_) {
    if (!p.ep) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    wait_for(ucp_ep_close_nbx(p.ep, &param), Deadline::After(std::chrono::seconds(1)));
    p.ep = nullptr;
  }
  // Requests left behind by a failure: cancel, let them complete, give them back to UCX.
  ForEachRequest([&](Request& r) {
    if (r.handle && !r.done) ucp_request_cancel(worker_, r.handle);
  });
  for (int i = 0; i < 100 && ProgressAll(); ++i) {
  }
  ForEachRequest([&](Request& r) {
    if (r.handle) ucp_request_free(r.handle);
  });
  slots_.clear();
  ucp_worker_destroy(worker_);  // the context goes with the last region
  control_.reset();  // says goodbye on the control mesh last: peers then know we left cleanly
}

void UcxTransport::Connect(const std::vector<std::string>& addresses, Deadline deadline) {
  if (static_cast<int>(addresses.size()) != size()) {
    Fail(ErrorKind::kInvalidArgument, "Connect: ", addresses.size(), " addresses for ", size(),
         " ranks");
  }
  std::vector<std::string> control, worker, hosts;
  std::vector<EagerCause> causes;
  for (const auto& a : addresses) {
    const size_t bar = a.find('|');
    if (bar == std::string::npos) {
      Fail(ErrorKind::kProtocol, "transport address '", a.substr(0, 64),
           "' is not a UCX one (is every rank run with CORTADO_TRANSPORT=ucx?)");
    }
    const size_t cause_bar = a.rfind('|');
    const std::optional<EagerCause> cause =
        cause_bar > bar && cause_bar + 2 == a.size() ? ParseEagerCause(a.back()) : std::nullopt;
    if (!cause) {
      Fail(ErrorKind::kProtocol, "UCX transport address '", a.substr(0, 64),
           "' ends in no eager choice (is every rank the same Cortado build?)");
    }
    control.push_back(a.substr(0, bar));
    worker.push_back(Unhex(a.substr(bar + 1, cause_bar - bar - 1)));
    hosts.push_back(HostOfControlAddress(control.back()));
    causes.push_back(*cause);
  }
  // Admission first: the handshake on the control mesh checks the job identity.
  control_->Connect(control, deadline);
  // One rule for "one host" (eager_policy.h): the hosts the eager choice was made from are the
  // ones the endpoints are made for.
  for (size_t r = 0; r < gathered_hosts_.size() && r < hosts.size(); ++r) {
    if (gathered_hosts_[r] != hosts[r]) {
      Fail(ErrorKind::kProtocol, "rank ", rank(), ": rank ", r, " announced host ",
           gathered_hosts_[r], " for the eager choice and ", hosts[r], " in its transport address");
    }
  }
  if (rank() == 0) ReportChoices(causes, hosts);
  const std::string& my_host = hosts[static_cast<size_t>(rank())];
  {
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      Peer& p = peers_[static_cast<size_t>(r)];
      p.transport = this;
      p.rank = r;
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(worker[static_cast<size_t>(r)].data());
      // Peer error handling where the peer is on another host (UCX then detects its failure on
      // rc/dc/tcp itself). Not within a host: UCX 1.13 has no peer failure detection on its
      // shared-memory transports, so asking for it would leave only tcp over loopback; there
      // the control mesh notices a dead process instead (its sockets close).
      const bool same_host = hosts[static_cast<size_t>(r)] == my_host;
      ep.err_mode = same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &UcxTransport::OnEndpointError;
      ep.err_handler.arg = &p;
      ucs_status_t s = ucp_ep_create(worker_, &ep, &p.ep);
      if (s != UCS_OK) {
        throw Error(ErrorKind::kSystem,
                    StrCat("rank ", rank(), ": UCX ucp_ep_create to rank ", r,
                           " failed: ", ucs_status_string(s)),
                    r, "connect");
      }
    }
    connected_ = true;
  }
  // Can this rank's allocations be mapped by its peers? Only when every rank is on this host,
  // and only if a probe region UCX allocates here exports (comes from shared memory and maps).
  bool can_share = false;
  if (AllOnOneHost(hosts) && size() > 1) {
    auto probe = Allocate(4096);
    can_share = !ExportRegion(*probe).empty();
  }
  // Wire up every endpoint now (a byte each way), so UCX's connection setup is neither in the
  // first collective's time nor its failure. The byte carries this rank's can_share, so every
  // rank ANDs the same flags into the same SharesMemory().
  char out = static_cast<char>(1 | (can_share ? 2 : 0));
  std::vector<char> in(static_cast<size_t>(size()));
  auto out_region = Register(&out, 1);
  auto in_region = Register(in.data(), in.size());
  std::vector<RequestId> ids;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    ids.push_back(PostRecv(r, *in_region, static_cast<size_t>(r), 1, kWireupTag));
    ids.push_back(PostSend(r, *out_region, 0, 1, kWireupTag));
  }
  for (RequestId id : ids) Wait(id, deadline);
  shares_memory_ = can_share;
  for (int r = 0; r < size(); ++r) {
    if (r != rank()) shares_memory_ &= (in[static_cast<size_t>(r)] & 2) != 0;
  }
}

void UcxTransport::ReportChoices(const std::vector<EagerCause>& causes,
                                 const std::vector<std::string>& hosts) {
  auto log_once = [](std::atomic<bool>& logged, const std::string& line) {
    if (!line.empty() && !logged.exchange(true)) {
      std::fprintf(stderr, "cortado: ucx transport: %s\n", line.c_str());
    }
  };
  static std::atomic<bool> disagreement_logged{false};
  log_once(disagreement_logged, DescribeDisagreement(causes));
  // Without a host exchange the choice took one host; only the shared-memory cause relied on it.
  static std::atomic<bool> assumption_logged{false};
  if (gathered_hosts_.empty() && eager_cause_ == EagerCause::kSharedMemory &&
      !AllOnOneHost(hosts)) {
    log_once(assumption_logged,
             "the eager choice took every rank to be on one host (this transport was made "
             "without a host exchange), but their control addresses name more than one; UCX's "
             "default rendezvous threshold was kept");
  }
}

std::unique_ptr<MemoryRegion> UcxTransport::Allocate(size_t bytes) {
#if defined(CORTADO_TSAN)
  // ThreadSanitizer cannot follow shared memory that UCX attaches and detaches itself (shmat
  // and shmdt are not intercepted): once the kernel reuses a detached segment's address, the
  // old accesses and the new read as a race. TSan builds therefore hand out heap memory, which
  // no peer can map, and never run the direct all-reduce; the other builds test it.
  return Transport::Allocate(bytes);
#else
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                 UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  p.address = nullptr;
  p.length = std::max<size_t>(bytes, 1);
  p.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(context_, &p, &memh);
  if (s != UCS_OK) {
    Fail(ErrorKind::kSystem, "rank ", rank(), ": UCX ucp_mem_map allocating ", bytes,
         " bytes failed: ", ucs_status_string(s));
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  s = ucp_mem_query(memh, &attr);
  if (s != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    Check(s, "ucp_mem_query");
  }
  return std::make_unique<UcxRegion>(attr.address, bytes, context_holder_, memh);
#endif
}

std::unique_ptr<UcxPeerMemory> UcxTransport::TryMap(int peer, const std::string& exported,
                                                    uint64_t remote_data, ucs_status_t* status) {
  ucp_rkey_h rkey = nullptr;
  *status = ucp_ep_rkey_unpack(peers_[static_cast<size_t>(peer)].ep, exported.data(), &rkey);
  if (*status != UCS_OK) return nullptr;
  void* local = nullptr;
  *status = ucp_rkey_ptr(rkey, remote_data, &local);
  if (*status != UCS_OK) {
    ucp_rkey_destroy(rkey);
    return nullptr;
  }
  return std::make_unique<UcxPeerMemory>(static_cast<char*>(local), rkey);
}

std::string UcxTransport::ExportRegion(const MemoryRegion& region) {
  auto* u = dynamic_cast<const UcxRegion*>(&region);
  if (u == nullptr || !u->owned() || u->memh() == nullptr) return {};
  if (u->exported) return *u->exported;
  u->exported.emplace();
  void* key = nullptr;
  size_t key_bytes = 0;
  if (ucp_rkey_pack(context_, u->memh(), &key, &key_bytes) != UCS_OK) return {};
  std::string packed(static_cast<const char*>(key), key_bytes);
  ucp_rkey_buffer_release(key);
  // Whether a peer can map it is decided by the memory domain UCX allocated it from (shared
  // memory maps, a fallback to anonymous pages does not): try it here, through the endpoint to
  // a peer, on this rank's own region.
  int peer = rank() == 0 ? 1 : 0;
  if (peer >= size() || peers_[static_cast<size_t>(peer)].ep == nullptr) return {};
  ucs_status_t status;
  auto mapped = TryMap(peer, packed, reinterpret_cast<uint64_t>(region.data()), &status);
  if (mapped == nullptr) return {};
  *u->exported = std::move(packed);
  return *u->exported;
}

std::unique_ptr<PeerMemory> UcxTransport::MapPeerRegion(int peer, const std::string& exported,
                                                        uint64_t remote_data, size_t bytes) {
  if (peer < 0 || peer >= size() || peer == rank() || !connected_) {
    Fail(ErrorKind::kInvalidArgument, "rank ", rank(), ": no connection to rank ", peer);
  }
  ucs_status_t status;
  auto mapped = TryMap(peer, exported, remote_data, &status);
  if (mapped == nullptr) {
    throw Error(ErrorKind::kSystem,
                StrCat("rank ", rank(), ": cannot map rank ", peer, "'s registered memory (", bytes,
                       " bytes): UCX ", ucs_status_string(status)),
                peer, "map");
  }
  return mapped;
}

void UcxTransport::Complete(Request& r, ucs_status_t status) {
  r.done = true;
  if (r.status == UCS_OK) r.status = status;
}

void UcxTransport::OnSend(void* request, ucs_status_t status, void* user_data) {
  Complete(*static_cast<Request*>(user_data), status);
}

void UcxTransport::OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                          void* user_data) {
  auto& r = *static_cast<Request*>(user_data);
  if (status == UCS_OK && info) r.received = info->length;
  Complete(r, status);
}

void UcxTransport::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  // Requests on the endpoint complete with an error status through their callbacks; later
  // posts to the peer fail at once.
  static_cast<Peer*>(arg)->error = status;
}

RequestId UcxTransport::PostSend(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                                 uint64_t tag) {
  return Post(/*send=*/true, peer, region, offset, bytes, tag);
}

RequestId UcxTransport::PostRecv(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                                 uint64_t tag) {
  return Post(/*send=*/false, peer, region, offset, bytes, tag);
}

RequestId UcxTransport::Post(bool send, int peer, const MemoryRegion& region, size_t offset,
                             size_t bytes, uint64_t tag) {
  internal::CheckTransfer(region, offset, bytes, peer, rank(), size());
  if (!connected_) Fail(ErrorKind::kInvalidArgument, "transfer before Connect");
  // A peer that aborted (the control mesh heard it) fails new operations at once, as TCP's
  // aborted connections do, even when the messages they need arrived before the abort.
  control_->CheckHealthy();
  Peer& p = peers_[static_cast<size_t>(peer)];
  RequestId id;
  Request& r = NewRequest(&id);
  r.peer = peer;
  r.send = send;
  r.expected = r.received = bytes;
  if (p.error != UCS_OK || aborted_) {
    Complete(r, p.error != UCS_OK ? p.error : UCS_ERR_CANCELED);
    return id;
  }
  ucp_request_param_t param{};
  // No UCP_OP_ATTR_FIELD_RECV_INFO: a message that had arrived already then completes through
  // the callback too, which reports its length.
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.user_data = &r;
  if (auto* u = dynamic_cast<const UcxRegion*>(&region); u && u->memh()) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = u->memh();
  }
  void* buffer = static_cast<char*>(region.data()) + offset;
  ucs_status_ptr_t h;
  if (send) {
    param.cb.send = &UcxTransport::OnSend;
    h = ucp_tag_send_nbx(p.ep, buffer, bytes, WireTag(rank(), tag), &param);
  } else {
    param.cb.recv = &UcxTransport::OnRecv;
    h = ucp_tag_recv_nbx(worker_, buffer, bytes, WireTag(peer, tag), kFullMask, &param);
  }
  if (h == nullptr) {
    r.done = true;
  } else if (UCS_PTR_IS_ERR(h)) {
    Complete(r, UCS_PTR_STATUS(h));
  } else {
    r.handle = h;
  }
  return id;
}

std::string UcxTransport::Describe(const Request& r) const {
  if (r.status == UCS_ERR_MESSAGE_TRUNCATED) {
    return StrCat("rank ", r.peer, " sent more than the ", r.expected,
                  " bytes expected (mismatched collective calls?)");
  }
  if (r.status == UCS_OK && r.received != r.expected) {
    return StrCat("rank ", r.peer, " sent ", r.received, " bytes where ", r.expected,
                  " were expected (mismatched collective calls?)");
  }
  return StrCat("rank ", r.peer, " failed: UCX ", r.send ? "send to" : "receive from", " rank ",
                r.peer, ": ", ucs_status_string(r.status));
}

void UcxTransport::ThrowFailed(const Request& r) {
  const std::string what = Describe(r);
  const int peer = r.peer;
  const bool mismatch = r.status == UCS_ERR_MESSAGE_TRUNCATED || r.status == UCS_OK;
  if (aborted_) {
    throw Error(ErrorKind::kPeerFailure, StrCat("the transport was aborted: ", abort_reason_),
                abort_rank_);
  }
  if (mismatch) throw Error(ErrorKind::kProtocol, what, peer);
  // A peer that aborted or died is also seen by the control mesh, which knows the root cause
  // (an abort notice names the rank it blames): give it a moment to report.
  Deadline grace = Deadline::After(kRootCauseGrace);
  while (!grace.Expired()) {
    control_->CheckHealthy();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw Error(ErrorKind::kPeerFailure, what, peer);
}

bool UcxTransport::Test(RequestId id) {
  ProgressAll();
  Request& r = Find(id);
  if (!r.done) {
    control_->CheckHealthy();
    return false;
  }
  const bool ok = r.status == UCS_OK && r.received == r.expected;
  Request copy = r;
  Release(r, id);
  if (!ok) ThrowFailed(copy);
  return true;
}

bool UcxTransport::Sleep(int timeout_ms) {
  // Arm, then sleep: UCS_ERR_BUSY means events arrived between the last progress and the arm.
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return false;
  pollfd pfd{event_fd_, POLLIN, 0};
  ::poll(&pfd, 1, timeout_ms);
  return true;
}

void UcxTransport::Wait(RequestId id, Deadline deadline) {
  Request& r = Find(id);
  // Polling for spin_us before a sleep pays on a fast link and is CPU lost on a slow one
  // (SpinPolicy); when and how long to poll or sleep is WaitPacer's (wait_pacer.h).
  const bool spin = spin_us_ > 0 && spin_policy_.ShouldSpin();
  WaitPacer pacer(std::chrono::microseconds(spin ? spin_us_ : 0));
  while (!r.done) {
    if (ProgressAll()) {
      pacer.Moved();  // poll on: a rendezvous transfer is driven by progress calls
      continue;
    }
    if (r.done || !pacer.ClockDue()) continue;
    const WaitPacer::Next next = pacer.Decide(Clock::now());
    control_->CheckHealthy();  // one atomic load while healthy
    if (next == WaitPacer::Next::kYieldAndPoll) sched_yield();
    if (next != WaitPacer::Next::kSleep) continue;
    if (deadline.Expired()) {
      throw Error(ErrorKind::kTimeout,
                  StrCat("rank ", rank(), ": deadline passed waiting for rank ", r.peer), r.peer);
    }
    // The sleep is bounded (at most WaitPacer::kMaxSleepMs) so that a failure the control plane
    // saw is noticed.
    const bool waited = Sleep(deadline.RemainingMs(pacer.sleep_ms()));
    if (waited) wait_sleeps_.fetch_add(1, std::memory_order_relaxed);
    pacer.Slept(waited);
  }
  if (pacer.polled()) spin_policy_.Record(!pacer.slept());
  const bool ok = r.status == UCS_OK && r.received == r.expected;
  Request copy = r;
  Release(r, id);
  if (!ok) ThrowFailed(copy);
}

Request& UcxTransport::NewRequest(RequestId* id) {
  if (free_slots_.empty()) {
    free_slots_.push_back(static_cast<uint32_t>(slots_.size()));
    slots_.push_back(std::make_unique<Request>());
  }
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  Request& r = *slots_[slot];
  const uint32_t generation = r.generation;
  r = Request{};
  r.in_use = true;
  r.generation = generation;
  *id = (static_cast<uint64_t>(generation) << 32) | (uint64_t{slot} + 1);
  return r;
}

Request& UcxTransport::Find(RequestId id) {
  const uint64_t slot = (id & 0xffffffffu) - 1;
  if (slot >= slots_.size() || !slots_[slot]->in_use || slots_[slot]->generation != (id >> 32)) {
    Fail(ErrorKind::kInvalidArgument, "unknown request ", id);
  }
  return *slots_[slot];
}

void UcxTransport::Release(Request& r, RequestId id) {
  if (r.handle) ucp_request_free(r.handle);
  r.handle = nullptr;
  r.in_use = false;
  ++r.generation;
  free_slots_.push_back(static_cast<uint32_t>((id & 0xffffffffu) - 1));
}

void UcxTransport::Abort(int root_rank, const std::string& reason) {
  control_->Abort(root_rank, reason);  // tells every peer, over the control mesh
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
  abort_rank_ = root_rank;
  // Give posted buffers back to the caller: cancel what is in flight, bounded in time.
  ForEachRequest([&](Request& r) {
    if (r.handle && !r.done) ucp_request_cancel(worker_, r.handle);
  });
  Deadline bound = Deadline::After(std::chrono::milliseconds(300));
  for (;;) {
    bool pending = false;
    ForEachRequest([&](Request& r) { pending |= r.handle && !r.done; });
    if (!pending || bound.Expired()) break;
    if (!ProgressAll()) Sleep(5);
  }
}

void UcxTransport::CheckHealthy() {
  control_->CheckHealthy();
  if (aborted_) {
    throw Error(ErrorKind::kPeerFailure, StrCat("the transport was aborted: ", abort_reason_),
                abort_rank_);
  }
}

}  // namespace
}  // namespace ucx

bool HasUcxTransport() { return true; }

std::unique_ptr<Transport> CreateUcxTransport(const UcxTransportOptions& options) {
  return std::make_unique<ucx::UcxTransport>(options);
}

}  // namespace cortado::dist
