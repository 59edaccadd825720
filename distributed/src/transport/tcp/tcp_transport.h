// Internal: the TCP transport (CORTADO_TRANSPORT=tcp): one connection per pair of ranks (a full
// mesh, so every rank notices any peer's death), framed messages (wire.h), TCP_NODELAY, optional
// large socket buffers. Its parts: connect.cpp and handshake.cpp (the mesh setup), io.cpp (the
// IO state machine of an open connection), transport.cpp (posting, completion, status queries,
// abort, the progress thread).
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/socket.h"
#include "cortado/dist/tcp_transport.h"
#include "cortado/dist/transport.h"
#include "transport/tcp/frames.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/wire.h"
#include "transport/transport_internal.h"

namespace cortado::dist::tcp {

using internal::ErrnoText;
using internal::Fd;
using internal::FrameHeader;
using internal::FrameTypeName;

// Receives land directly in the posted buffer: a frame's header is read into a small staging
// buffer together with whatever follows it in the socket, and the payload is then read straight
// into the destination, with kTailBytes more into staging (readv) to catch the next header
// without another system call; kept small because whatever payload lands in staging is copied.
constexpr size_t kStagingBytes = 64 << 10;
constexpr size_t kTailBytes = 512;
// A header read (nothing pending) asks for this much: small frames arrive whole, while little
// of a large payload lands in staging.
constexpr size_t kHeaderReadBytes = 4 << 10;
// Pure busy polling at the start of a wait, before polls start yielding the core.
constexpr int kBusyPollUs = 10;
// The most a connection's receive low-water mark asks for before it wakes a waiter (see
// TcpTransport::UpdateLowWaterLocked): a chunk of the default pipeline, so a chunk arriving over a
// slow link costs one wake-up instead of one per burst of packets, while the mark stays well
// inside the receive window autotuning grows.
constexpr size_t kMaxLowWater = 256 << 10;
constexpr uint32_t kWakeKey = 0xffffffffu;

// "sent N bytes for tag 0xT where M were expected (...)": a data frame that does not fit the
// receive posted for its tag.
std::string SizeMismatch(size_t sent, uint64_t tag, size_t expected);

class TcpRegion final : public MemoryRegion {
 public:
  TcpRegion(void* data, size_t size) : MemoryRegion(data, size) {}
};

struct Request {
  int peer = -1;
  bool done = false;
  bool failed = false;
  std::string error;
};

struct SendItem {
  RequestId id = 0;  // 0 for control frames
  FrameHeader header{};
  const char* data = nullptr;
  size_t len = 0;
  std::string owned;        // control payload, or a copy made by Abort; data points into it
  size_t payload_base = 0;  // payload offset that data points to (non-zero only for such copies)
  size_t done = 0;          // bytes of header + payload written
};

struct RecvItem {
  RequestId id;
  uint64_t tag;
  char* data;
  size_t len;
};

struct Unexpected {
  uint64_t tag;
  std::vector<char> data;
};

enum class ConnState { kOpen, kGoodbye, kAborted, kFailed, kClosed };
enum class RState { kHeader, kPayload, kStalled };

struct Conn {
  int peer = -1;
  Fd fd;
  ConnState state = ConnState::kOpen;
  std::deque<SendItem> sendq;
  std::deque<RecvItem> posted;
  std::deque<Unexpected> unexpected;
  size_t unexpected_bytes = 0;
  RState rstate = RState::kHeader;
  FrameHeader hdr{};
  char* dst = nullptr;
  size_t dst_len = 0;
  size_t dst_have = 0;
  RequestId dst_id = 0;  // the posted receive being filled; 0: unexpected or control frame
  std::vector<char> body;
  std::unique_ptr<char[]> staging;
  size_t st_begin = 0;
  size_t st_end = 0;
  bool readable = true;
  bool writable = true;
  bool hangup = false;   // the peer closed its side (EPOLLRDHUP): stop stalling, read to the end
  bool discard = false;  // the current payload is read and dropped (after Abort)
  int low_water = 1;     // the socket's SO_RCVLOWAT as last set
  PeerStatus status;

  bool Readable() const {
    return state == ConnState::kOpen || state == ConnState::kGoodbye ||
           state == ConnState::kAborted;
  }
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TcpTransportOptions& options);
  ~TcpTransport() override;

  const char* name() const override { return "tcp"; }
  std::string LocalAddress() const override { return address_; }
  void Connect(const std::vector<std::string>& addresses, Deadline deadline) override;
  std::unique_ptr<MemoryRegion> Register(void* data, size_t bytes) override {
    return std::make_unique<TcpRegion>(data, bytes);
  }
  RequestId PostSend(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                     uint64_t tag) override;
  RequestId PostRecv(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                     uint64_t tag) override;
  bool Test(RequestId id) override;
  void Wait(RequestId id, Deadline deadline) override;
  void BeginOperation(uint64_t seq) override;
  void EndOperation(uint64_t seq) override;
  std::vector<PeerStatus> QueryStatus(Deadline deadline) override;
  void Abort(int root_rank, const std::string& reason) override;
  void CheckHealthy() override;
  uint64_t WaitSleeps() const override { return wait_sleeps_.load(std::memory_order_relaxed); }

  // For a transport that uses this one as its control plane (UCX): reports the operation
  // counters peers see in QueryStatus without parking the progress thread, which keeps
  // watching the connections during operations too.
  void ReportOperations(uint64_t started, uint64_t finished) {
    ops_started_.store(started, std::memory_order_relaxed);
    ops_finished_.store(finished, std::memory_order_relaxed);
  }

 private:
  struct Failure {
    int rank;
    std::string what;
    bool notice;  // learned from a peer's abort rather than seen directly
  };

  // Mesh setup (connect.cpp): one round of polling the listener and the pending handshakes.
  void PollHandshakes(const HandshakeContext& context, std::vector<Handshake>* pending,
                      int* inbound_missing);
  void AdoptConnection(int peer, Fd fd);  // an admitted connection joins the mesh
  std::vector<int> MissingPeers() const;  // ranks without a connection yet

  // Everything below requires io_mu_.
  bool ProgressLocked();
  bool WriteSome(Conn& c);
  bool ReadSome(Conn& c);
  void ParseStaging(Conn& c);
  void BeginPayload(Conn& c);
  void FinishPayload(Conn& c);
  void HandleControl(Conn& c);
  void HandleEof(Conn& c, const std::string& how);
  void FailConn(Conn& c, const std::string& why);
  void FailPending(Conn& c, const std::string& why);
  void QueueControl(Conn& c, internal::FrameType type, uint64_t tag, std::string payload);
  void ApplyEvents(const epoll_event* events, int n);
  // Sets each connection's receive low-water mark before a sleep: the rest of the payload being
  // received (at most kMaxLowWater) while one is, so the sleeper wakes once per chunk rather than
  // per burst of packets of a slowly draining link; 1 otherwise, so a header or a control frame
  // (a status reply, an abort) wakes it at once.
  void UpdateLowWaterLocked();
  int BlockForEvents(std::unique_lock<std::mutex>& lock, int epfd, int timeout_ms);
  Conn* PeerConn(int peer, const char* what);
  RequestId NewRequest(int peer);
  RequestId FailedRequest(int peer, const std::string& why);  // a new request, failed already
  void MarkFailed(RequestId id, const std::string& why);      // unless it is done
  // PostRecv of a message that arrived before its receive was posted.
  RequestId TakeUnexpected(Conn& c, std::deque<Unexpected>::iterator message, char* dst,
                           size_t bytes);
  [[noreturn]] void ThrowFailureLocked();
  bool HasFailureLocked() const { return !failures_.empty() || !broken_.empty(); }
  void WakeProgressThread();
  void ProgressThreadLoop();
  void AddToEpoll(Conn& c);
  void ShutdownConnections();

  TcpTransportOptions options_;
  Fd listen_fd_;
  std::string address_;
  std::vector<std::unique_ptr<Conn>> conns_;  // by peer rank; null for this rank
  Fd caller_epfd_;
  Fd thread_epfd_;
  Fd wake_fd_;

  // Progress. All socket IO happens under io_mu_, done by whichever thread holds it:
  //   - the driving thread inside Wait/Test (the communicator's, during a collective): it writes
  //     queued frames and reads incoming ones until the socket would block or the message it
  //     waits for is complete (so a ring chunk is reduced while still in cache, before more
  //     data is pulled in behind it), polls briefly (CommOptions::spin_us; yielding the core
  //     after kBusyPollUs, in case the peer shares it; and only while polling pays, see
  //     SpinPolicy), then sleeps in epoll_wait on caller_epfd_, with each socket's receive
  //     low-water mark set so that a payload arriving slowly wakes it once per chunk;
  //   - the progress thread, between operations: it sleeps in epoll_wait on thread_epfd_ (both
  //     sets edge-triggered) and does the same IO, so posted sends keep moving, status queries
  //     are answered and dead peers are noticed while the application computes. While a driver
  //     is active (BeginOperation..EndOperation, counted in drivers_) it parks on park_cv_
  //     instead, so it neither spins nor steals the core the reduction runs on.
  std::mutex io_mu_;
  std::unordered_map<RequestId, Request> requests_;
  RequestId next_id_ = 1;
  std::vector<Failure> failures_;
  std::string broken_;
  int broken_rank_ = -1;
  bool connected_ = false;
  // The request the driving thread waits for: reading stops once it completes, so the caller
  // can reduce a chunk while it is still in cache (and post what depends on it) before more
  // data is pulled in behind it.
  RequestId awaited_ = 0;
  bool awaited_done_ = false;
  internal::SpinPolicy spin_policy_;  // whether Wait polls before it sleeps
  std::atomic<uint64_t> wait_sleeps_{0};

  // Set (under io_mu_) when failures_ or broken_ first becomes non-empty, so CheckHealthy
  // costs one load, not the mutex, on the UCX transport's per-message path.
  std::atomic<bool> unhealthy_{false};
  std::atomic<int> drivers_{0};
  std::atomic<uint64_t> ops_started_{0};
  std::atomic<uint64_t> ops_finished_{0};
  std::atomic<bool> stop_{false};
  std::mutex park_mu_;
  std::condition_variable park_cv_;
  std::thread progress_thread_;
};

}  // namespace cortado::dist::tcp
