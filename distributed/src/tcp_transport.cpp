// The TCP transport: one connection per pair of ranks (a full mesh, so every rank notices any
// peer's death), framed messages (wire.h), TCP_NODELAY, optional large socket buffers.
//
// Progress model. All socket IO happens under io_mu_, done by whichever thread holds it:
//   - the driving thread inside Wait/Test (the communicator's, during a collective): it writes
//     queued frames and reads incoming ones until the socket would block or the message it waits
//     for is complete (so a ring chunk is reduced while still in cache, before more data is
//     pulled in behind it), polls briefly (CommOptions::spin_us; yielding the core after
//     kBusyPollUs, in case the peer shares it) and then sleeps in epoll_wait on its own epoll set;
//   - the progress thread, between operations: it sleeps in epoll_wait on a second epoll set
//     (both edge-triggered) and does the same IO, so posted sends keep moving, status queries
//     are answered and dead peers are noticed while the application computes. While a driver
//     is active (BeginOperation..EndOperation) it parks on a timed condition variable instead,
//     so it neither spins nor steals the core the reduction runs on.
// Receives land directly in the posted buffer: a frame's header is read into a small staging
// buffer together with whatever follows it in the socket, and the payload is then read straight
// into the destination (readv with the staging buffer as the second vector, so the next header
// arrives in the same system call). Only unexpected frames - no receive posted yet - are copied.
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "cortado/dist/error.h"
#include "cortado/dist/transport.h"
#include "frames.h"
#include "socket.h"
#include "wire.h"

namespace cortado::dist {
namespace {

using internal::ErrnoText;
using internal::Fd;
using internal::FrameHeader;
using internal::FrameTypeName;

// The staging buffer holds frame headers and small payloads. Reading a payload straight into
// its destination also asks for kTailBytes more into staging, to catch the next header without
// another system call; it is kept small because whatever payload lands in staging is copied.
constexpr size_t kStagingBytes = 64 << 10;
constexpr size_t kTailBytes = 512;
// A header read (nothing pending) asks for this much: small frames arrive whole, while little
// of a large payload lands in staging.
constexpr size_t kHeaderReadBytes = 4 << 10;
// Pure busy polling at the start of a wait, before polls start yielding the core.
constexpr int kBusyPollUs = 10;
constexpr uint32_t kWakeKey = 0xffffffffu;

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
  int rank() const override { return rank_; }
  int size() const override { return size_; }
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

 private:
  struct Failure {
    int rank;
    std::string what;
    bool notice;  // learned from a peer's abort rather than seen directly
  };

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
  int BlockForEvents(std::unique_lock<std::mutex>& lock, int epfd, int timeout_ms);
  void CheckRegion(const MemoryRegion& region, size_t offset, size_t bytes, int peer) const;
  Conn* PeerConn(int peer, const char* what);
  RequestId NewRequest(int peer);
  [[noreturn]] void ThrowFailureLocked();
  bool HasFailureLocked() const { return !failures_.empty() || !broken_.empty(); }
  void WakeProgressThread();
  void ProgressThreadLoop();
  void AddToEpoll(Conn& c);
  void ShutdownConnections();

  TcpTransportOptions options_;
  int rank_;
  int size_;
  Fd listen_fd_;
  std::string address_;
  std::vector<std::unique_ptr<Conn>> conns_;  // by peer rank; null for this rank
  Fd caller_epfd_;
  Fd thread_epfd_;
  Fd wake_fd_;

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

  std::atomic<int> drivers_{0};
  std::atomic<uint64_t> ops_started_{0};
  std::atomic<uint64_t> ops_finished_{0};
  std::atomic<bool> stop_{false};
  std::mutex park_mu_;
  std::condition_variable park_cv_;
  std::thread progress_thread_;
};

TcpTransport::TcpTransport(const TcpTransportOptions& options)
    : options_(options), rank_(options.rank), size_(options.identity.world_size) {
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    Fail(ErrorKind::kInvalidArgument, "tcp transport: rank ", rank_, " outside world of ", size_);
  }
  std::string host = options.listen_host.empty() ? "0.0.0.0" : options.listen_host;
  listen_fd_ = internal::ListenTcp(host, 0, std::max(128, size_));
  std::string shown = host == "0.0.0.0" ? "127.0.0.1" : host;
  address_ = StrCat(shown, ":", internal::LocalPort(listen_fd_.get()));
  conns_.resize(static_cast<size_t>(size_));
  caller_epfd_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  thread_epfd_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!caller_epfd_ || !thread_epfd_ || !wake_fd_) {
    Fail(ErrorKind::kSystem, "tcp transport: epoll/eventfd: ", ErrnoText(errno));
  }
  for (int epfd : {caller_epfd_.get(), thread_epfd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u32 = kWakeKey;
    ::epoll_ctl(epfd, EPOLL_CTL_ADD, wake_fd_.get(), &ev);
  }
}

TcpTransport::~TcpTransport() {
  stop_ = true;
  { std::lock_guard<std::mutex> lock(park_mu_); }
  park_cv_.notify_all();
  WakeProgressThread();
  if (progress_thread_.joinable()) progress_thread_.join();
  ShutdownConnections();
}

void TcpTransport::ShutdownConnections() {
  std::unique_lock<std::mutex> lock(io_mu_);
  // Say goodbye so peers still finishing their last operation do not mistake our exit for a
  // crash, flush for a bounded time, then close.
  if (broken_.empty()) {
    for (auto& c : conns_) {
      if (c && c->state == ConnState::kOpen) {
        QueueControl(*c, internal::kFrameGoodbye, 0, {});
      }
    }
  }
  Deadline flush = Deadline::After(std::chrono::seconds(1));
  for (;;) {
    bool pending = false;
    for (auto& c : conns_) {
      if (c && c->fd && !c->sendq.empty() && c->state != ConnState::kFailed) pending = true;
    }
    if (!pending || flush.Expired()) break;
    if (!ProgressLocked()) BlockForEvents(lock, caller_epfd_.get(), 10);
  }
  for (auto& c : conns_) {
    if (!c || !c->fd) continue;
    ::shutdown(c->fd.get(), SHUT_WR);
    char sink[4096];
    while (::recv(c->fd.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
    c->fd.Reset();
  }
}

void TcpTransport::WakeProgressThread() {
  uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof(one));
}

void TcpTransport::AddToEpoll(Conn& c) {
  for (int epfd : {caller_epfd_.get(), thread_epfd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u32 = static_cast<uint32_t>(c.peer);
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, c.fd.get(), &ev) != 0) {
      Fail(ErrorKind::kSystem, "epoll_ctl: ", ErrnoText(errno));
    }
  }
}

// ----------------------------------------------------------------------------------------------
// Connection setup: dial the lower ranks, accept the higher ones, all in one poll loop so a
// stranger that connects and says nothing cannot hold up the mesh.

namespace {

struct Handshake {
  enum Kind { kDialing, kAwaitAck, kAwaitHello } kind;
  int peer = -1;  // for dials
  Fd fd;
  std::string in;
  Deadline expires = Deadline::Never();
  Clock::time_point retry_at{};
};

bool SplitHostPort(const std::string& address, std::string* host, int* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  try {
    *port = std::stoi(address.substr(colon + 1));
  } catch (const std::exception&) {
    return false;
  }
  return *port > 0 && *port < 65536;
}

Fd StartConnect(const std::string& address, std::string* why) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(address, &host, &port)) {
    Fail(ErrorKind::kProtocol, "malformed transport address '", address, "'");
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    Fail(ErrorKind::kProtocol, "transport address '", address, "' is not IPv4");
  }
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) Fail(ErrorKind::kSystem, "socket: ", ErrnoText(errno));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 &&
      errno != EINPROGRESS) {
    *why = ErrnoText(errno);
    return Fd();
  }
  return fd;
}

std::string FrameBytes(internal::FrameType type, uint64_t tag, const std::string& payload) {
  FrameHeader h = internal::MakeHeader(type, tag, payload.size());
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  return out + payload;
}

// Reads the handshake frame into `in`, never past its end: data frames may follow it at once,
// and they belong to the connection's stream. Returns false on EOF or error.
bool ReadHandshake(int fd, std::string* in) {
  for (;;) {
    size_t want = sizeof(FrameHeader);
    if (in->size() >= sizeof(FrameHeader)) {
      FrameHeader h;
      std::memcpy(&h, in->data(), sizeof(h));
      if (h.magic != internal::kFrameMagic || h.length > internal::kMaxControlPayload) return true;
      want += h.length;
    }
    if (in->size() >= want) return true;
    char buf[4096];
    size_t ask = std::min(sizeof(buf), want - in->size());
    ssize_t n = ::recv(fd, buf, ask, MSG_DONTWAIT);
    if (n > 0) {
      in->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return false;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
}

}  // namespace

void TcpTransport::Connect(const std::vector<std::string>& addresses, Deadline deadline) {
  if (static_cast<int>(addresses.size()) != size_) {
    Fail(ErrorKind::kInvalidArgument, "Connect: ", addresses.size(), " addresses for ", size_,
         " ranks");
  }
  if (connected_) Fail(ErrorKind::kInvalidArgument, "Connect called twice");
  internal::HelloPayload mine{};
  mine.from_rank = static_cast<uint32_t>(rank_);
  mine.world_size = static_cast<uint32_t>(size_);
  mine.token_digest = options_.identity.TokenDigest();
  mine.fingerprint = options_.identity.fingerprint;

  std::vector<Handshake> pending;
  auto dial = [&](int peer) {
    Handshake h;
    h.kind = Handshake::kDialing;
    h.peer = peer;
    std::string why;
    h.fd = StartConnect(addresses[static_cast<size_t>(peer)], &why);
    if (!h.fd) h.retry_at = Clock::now() + std::chrono::milliseconds(50);
    pending.push_back(std::move(h));
  };
  for (int peer = 0; peer < rank_; ++peer) dial(peer);
  int inbound_missing = size_ - 1 - rank_;

  auto establish = [&](int peer, Fd fd) {
    auto c = std::make_unique<Conn>();
    c->peer = peer;
    c->fd = std::move(fd);
    c->staging.reset(new char[kStagingBytes]);
    c->status.rank = peer;
    internal::SetNonBlocking(c->fd.get(), true);
    internal::SetNoDelay(c->fd.get());
    internal::SetBuffers(c->fd.get(), options_.socket_buffer_bytes);
    internal::SetKeepAlive(c->fd.get());
    AddToEpoll(*c);
    conns_[static_cast<size_t>(peer)] = std::move(c);
  };
  auto missing = [&] {
    std::vector<int> out;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && !conns_[static_cast<size_t>(r)]) out.push_back(r);
    }
    return out;
  };

  for (;;) {
    if (missing().empty()) break;
    if (deadline.Expired()) {
      auto ranks = missing();
      std::string list;
      for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
      throw Error(
          ErrorKind::kTimeout,
          StrCat("rank ", rank_, ": connecting to the other ranks: no connection with rank(s) ",
                 list, " before the deadline"),
          ranks.front(), "connect", ranks);
    }
    std::vector<pollfd> fds;
    std::vector<int> index;  // pending index per pollfd; -1: listener
    if (inbound_missing > 0) {
      fds.push_back({listen_fd_.get(), POLLIN, 0});
      index.push_back(-1);
    }
    auto now = Clock::now();
    for (size_t i = 0; i < pending.size(); ++i) {
      Handshake& h = pending[i];
      if (h.kind == Handshake::kDialing && !h.fd) {
        if (now >= h.retry_at) {
          std::string why;
          h.fd = StartConnect(addresses[static_cast<size_t>(h.peer)], &why);
          if (!h.fd) {
            h.retry_at = now + std::chrono::milliseconds(50);
            continue;
          }
        } else {
          continue;
        }
      }
      short events = h.kind == Handshake::kDialing ? POLLOUT : POLLIN;
      fds.push_back({h.fd.get(), events, 0});
      index.push_back(static_cast<int>(i));
    }
    int n = ::poll(fds.data(), fds.size(), deadline.RemainingMs(50));
    if (n < 0 && errno != EINTR) Fail(ErrorKind::kSystem, "poll: ", ErrnoText(errno));
    std::vector<size_t> finished;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      if (index[k] < 0) {
        int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
          Handshake h;
          h.kind = Handshake::kAwaitHello;
          h.fd = Fd(fd);
          h.expires = Deadline::After(std::chrono::seconds(10));
          pending.push_back(std::move(h));
        }
        continue;
      }
      size_t i = static_cast<size_t>(index[k]);
      Handshake& h = pending[i];
      if (h.kind == Handshake::kDialing) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(h.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          h.fd.Reset();
          h.retry_at = Clock::now() + std::chrono::milliseconds(50);
          continue;
        }
        internal::HelloPayload hello = mine;
        hello.to_rank = static_cast<uint32_t>(h.peer);
        std::string bytes =
            FrameBytes(internal::kFrameHello, 0,
                       std::string(reinterpret_cast<const char*>(&hello), sizeof(hello)));
        internal::WriteFull(h.fd.get(), bytes.data(), bytes.size(), deadline, "transport hello");
        h.kind = Handshake::kAwaitAck;
        continue;
      }
      bool open = ReadHandshake(h.fd.get(), &h.in);
      FrameHeader fh{};
      std::string payload;
      if (h.kind == Handshake::kAwaitAck) {
        bool complete = false;
        try {
          complete = ParseHandshakeFrame(h.in, &fh, &payload);
        } catch (const Error& e) {
          Fail(ErrorKind::kProtocol, "rank ", rank_, ": rank ", h.peer, " answered the hello with ",
               e.what());
        }
        if (!complete) {
          if (!open) {
            // The peer closed before answering (e.g. a stale listener): retry the dial.
            h.fd.Reset();
            h.in.clear();
            h.kind = Handshake::kDialing;
            h.retry_at = Clock::now() + std::chrono::milliseconds(50);
          }
          continue;
        }
        if (fh.type == internal::kFrameReject) {
          throw Error(ErrorKind::kRejected,
                      StrCat("rank ", h.peer, " rejected rank ", rank_, ": ", payload), h.peer,
                      "connect");
        }
        if (fh.type != internal::kFrameHelloAck) {
          Fail(ErrorKind::kProtocol, "rank ", h.peer, " answered the hello with a ",
               FrameTypeName(fh.type), " frame");
        }
        establish(h.peer, std::move(h.fd));
        finished.push_back(i);
        continue;
      }
      // kAwaitHello: an inbound connection; anything wrong gets a reject and is dropped.
      std::string reject;
      internal::HelloPayload hello{};
      try {
        if (!ParseHandshakeFrame(h.in, &fh, &payload)) {
          if (!open) finished.push_back(i);
          continue;
        }
        if (fh.type != internal::kFrameHello || payload.size() != sizeof(hello)) {
          reject = StrCat("expected a hello frame, got ", FrameTypeName(fh.type));
        } else {
          std::memcpy(&hello, payload.data(), sizeof(hello));
          const bool connected = hello.from_rank < static_cast<uint32_t>(size_) &&
                                 conns_[static_cast<size_t>(hello.from_rank)] != nullptr;
          reject = internal::HelloRejection(hello, mine, rank_, size_, connected);
        }
      } catch (const Error& e) {
        reject = e.what();
      }
      if (!reject.empty()) {
        std::string bytes = FrameBytes(internal::kFrameReject, 0, reject);
        (void)!::send(h.fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        finished.push_back(i);
        continue;
      }
      std::string ack = FrameBytes(internal::kFrameHelloAck, 0, {});
      internal::WriteFull(h.fd.get(), ack.data(), ack.size(), deadline, "transport hello ack");
      establish(static_cast<int>(hello.from_rank), std::move(h.fd));
      --inbound_missing;
      finished.push_back(i);
    }
    for (size_t i = 0; i < pending.size(); ++i) {
      if (pending[i].kind == Handshake::kAwaitHello && pending[i].expires.Expired()) {
        finished.push_back(i);
      }
    }
    std::sort(finished.begin(), finished.end());
    finished.erase(std::unique(finished.begin(), finished.end()), finished.end());
    for (auto it = finished.rbegin(); it != finished.rend(); ++it) {
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(*it));
    }
  }
  listen_fd_.Reset();  // the mesh is complete; later strangers are refused by the kernel
  connected_ = true;
  progress_thread_ = std::thread([this] { ProgressThreadLoop(); });
}

// ----------------------------------------------------------------------------------------------
// Posting and completion.

void TcpTransport::CheckRegion(const MemoryRegion& region, size_t offset, size_t bytes,
                               int peer) const {
  if (offset > region.size() || bytes > region.size() - offset) {
    Fail(ErrorKind::kInvalidArgument, "transfer of ", bytes, " bytes at offset ", offset,
         " exceeds the registered region of ", region.size(), " bytes");
  }
  if (peer < 0 || peer >= size_ || peer == rank_) {
    Fail(ErrorKind::kInvalidArgument, "rank ", rank_, ": no connection to rank ", peer);
  }
}

Conn* TcpTransport::PeerConn(int peer, const char* what) {
  if (!connected_) Fail(ErrorKind::kInvalidArgument, what, " before Connect");
  return conns_[static_cast<size_t>(peer)].get();
}

RequestId TcpTransport::NewRequest(int peer) {
  RequestId id = next_id_++;
  Request& r = requests_[id];
  r.peer = peer;
  return id;
}

RequestId TcpTransport::PostSend(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                                 uint64_t tag) {
  CheckRegion(region, offset, bytes, peer);
  std::lock_guard<std::mutex> lock(io_mu_);
  Conn* c = PeerConn(peer, "PostSend");
  RequestId id = NewRequest(peer);
  if (c->state != ConnState::kOpen) {
    Request& r = requests_[id];
    r.failed = true;
    r.error = StrCat("rank ", peer, " is no longer connected");
    return id;
  }
  SendItem s;
  s.id = id;
  s.header = internal::MakeHeader(internal::kFrameData, tag, bytes);
  s.data = static_cast<const char*>(region.data()) + offset;
  s.len = bytes;
  c->sendq.push_back(std::move(s));
  if (drivers_.load(std::memory_order_relaxed) == 0) WakeProgressThread();
  return id;
}

RequestId TcpTransport::PostRecv(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                                 uint64_t tag) {
  CheckRegion(region, offset, bytes, peer);
  std::lock_guard<std::mutex> lock(io_mu_);
  Conn* c = PeerConn(peer, "PostRecv");
  RequestId id = NewRequest(peer);
  char* dst = static_cast<char*>(region.data()) + offset;
  // A message that already arrived unexpectedly is copied out now.
  for (auto it = c->unexpected.begin(); it != c->unexpected.end(); ++it) {
    if (it->tag != tag) continue;
    Request& r = requests_[id];
    if (it->data.size() != bytes) {
      r.failed = true;
      r.error = StrCat("rank ", peer, " sent ", it->data.size(), " bytes for tag 0x", std::hex, tag,
                       std::dec, " where ", bytes, " were expected (mismatched collective calls?)");
    } else {
      if (bytes) std::memcpy(dst, it->data.data(), bytes);
      r.done = true;
    }
    c->unexpected_bytes -= it->data.size();
    c->unexpected.erase(it);
    if (c->rstate == RState::kStalled) BeginPayload(*c);
    return id;
  }
  if (!c->Readable()) {
    Request& r = requests_[id];
    r.failed = true;
    r.error = StrCat("rank ", peer, " is no longer connected");
    return id;
  }
  // The message may be arriving right now as an unexpected one: take it over, moving what has
  // arrived so far, and let the rest land in place.
  if (c->rstate == RState::kPayload && c->hdr.type == internal::kFrameData && c->dst_id == 0 &&
      !c->discard && c->hdr.tag == tag) {
    Request& r = requests_[id];
    if (c->dst_len != bytes) {
      r.failed = true;
      r.error = StrCat("rank ", peer, " sent ", c->dst_len, " bytes for tag 0x", std::hex, tag,
                       std::dec, " where ", bytes, " were expected (mismatched collective calls?)");
      return id;
    }
    if (c->dst_have) std::memcpy(dst, c->body.data(), c->dst_have);
    c->body = {};
    c->dst = dst;
    c->dst_id = id;
    return id;
  }
  c->posted.push_back(RecvItem{id, tag, dst, bytes});
  if (c->rstate == RState::kStalled) BeginPayload(*c);  // the stalled frame may be this one
  if (drivers_.load(std::memory_order_relaxed) == 0) WakeProgressThread();
  return id;
}

bool TcpTransport::Test(RequestId id) {
  std::lock_guard<std::mutex> lock(io_mu_);
  ProgressLocked();
  auto it = requests_.find(id);
  if (it == requests_.end()) Fail(ErrorKind::kInvalidArgument, "unknown request ", id);
  if (it->second.done) {
    requests_.erase(it);
    return true;
  }
  if (it->second.failed || HasFailureLocked()) ThrowFailureLocked();
  return false;
}

void TcpTransport::Wait(RequestId id, Deadline deadline) {
  std::unique_lock<std::mutex> lock(io_mu_);
  const auto t_start = Clock::now();
  const auto spin_until = t_start + std::chrono::microseconds(options_.spin_us);
  awaited_ = id;
  awaited_done_ = false;
  struct Reset {
    TcpTransport* t;
    ~Reset() {
      t->awaited_ = 0;
      t->awaited_done_ = false;
    }
  } reset{this};
  for (;;) {
    auto it = requests_.find(id);
    if (it == requests_.end()) Fail(ErrorKind::kInvalidArgument, "unknown request ", id);
    if (it->second.done) {
      requests_.erase(it);
      return;
    }
    if (it->second.failed || HasFailureLocked()) ThrowFailureLocked();
    if (ProgressLocked()) continue;
    it = requests_.find(id);
    if (it->second.done || it->second.failed || HasFailureLocked()) continue;
    if (deadline.Expired()) {
      int peer = it->second.peer;
      throw Error(ErrorKind::kTimeout,
                  StrCat("rank ", rank_, ": deadline passed waiting for rank ", peer), peer);
    }
    // Poll before sleeping: a reply on an idle core arrives in microseconds, far sooner than a
    // wake-up from epoll. After the first few microseconds, yield between polls: when the peer
    // shares our core (more ranks than cores, or another busy process), it can then run.
    auto now = Clock::now();
    int timeout = 0;
    if (now >= spin_until) {
      timeout = deadline.RemainingMs(200);
    } else if (now - t_start > std::chrono::microseconds(kBusyPollUs)) {
      lock.unlock();
      sched_yield();
      lock.lock();
    }
    BlockForEvents(lock, caller_epfd_.get(), timeout);
  }
}

int TcpTransport::BlockForEvents(std::unique_lock<std::mutex>& lock, int epfd, int timeout_ms) {
  epoll_event events[64];
  lock.unlock();
  int n = ::epoll_wait(epfd, events, 64, timeout_ms);
  lock.lock();
  if (n > 0) ApplyEvents(events, n);
  return n > 0 ? n : 0;
}

void TcpTransport::ApplyEvents(const epoll_event* events, int n) {
  for (int i = 0; i < n; ++i) {
    uint32_t key = events[i].data.u32;
    if (key == kWakeKey) {
      uint64_t v;
      (void)!::read(wake_fd_.get(), &v, sizeof(v));
      continue;
    }
    if (key >= conns_.size() || !conns_[key]) continue;
    Conn& c = *conns_[key];
    uint32_t ev = events[i].events;
    if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) c.readable = true;
    if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      c.hangup = true;
      if (c.rstate == RState::kStalled) BeginPayload(c);
    }
    if (ev & (EPOLLOUT | EPOLLHUP | EPOLLERR)) c.writable = true;
  }
}

void TcpTransport::BeginOperation(uint64_t seq) {
  ops_started_.store(seq, std::memory_order_relaxed);
  drivers_.fetch_add(1, std::memory_order_acq_rel);
}

void TcpTransport::EndOperation(uint64_t seq) {
  ops_finished_.store(seq, std::memory_order_relaxed);
  drivers_.fetch_sub(1, std::memory_order_acq_rel);
  // No wake-up here: the parked progress thread looks again within its park interval, which
  // keeps back-to-back small operations free of cross-thread wake-ups.
}

// ----------------------------------------------------------------------------------------------
// The IO state machine.

bool TcpTransport::ProgressLocked() {
  bool progressed = false;
  for (auto& cp : conns_) {
    if (!cp || !cp->fd) continue;
    Conn& c = *cp;
    if (c.writable && !c.sendq.empty() && c.state != ConnState::kFailed) {
      progressed |= WriteSome(c);
    }
    if (c.fd && (c.readable || c.st_begin < c.st_end) && c.Readable()) progressed |= ReadSome(c);
  }
  return progressed;
}

bool TcpTransport::WriteSome(Conn& c) {
  bool progressed = false;
  while (c.writable && !c.sendq.empty()) {
    iovec iov[64];
    int k = 0;
    size_t want = 0;
    for (auto& s : c.sendq) {
      if (k > 62) break;
      size_t off = s.done;
      if (off < sizeof(FrameHeader)) {
        iov[k].iov_base = reinterpret_cast<char*>(&s.header) + off;
        iov[k].iov_len = sizeof(FrameHeader) - off;
        want += iov[k++].iov_len;
        off = 0;
      } else {
        off -= sizeof(FrameHeader);
      }
      if (s.len > off) {
        iov[k].iov_base = const_cast<char*>(s.data + (off - s.payload_base));
        iov[k].iov_len = s.len - off;
        want += iov[k++].iov_len;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(k);
    ssize_t n = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        c.writable = false;
        break;
      }
      int err = errno;
      HandleEof(c, StrCat("send failed: ", ErrnoText(err)));
      return true;
    }
    progressed = true;
    size_t left = static_cast<size_t>(n);
    while (left > 0) {
      SendItem& s = c.sendq.front();
      size_t total = sizeof(FrameHeader) + s.len;
      size_t take = std::min(left, total - s.done);
      s.done += take;
      left -= take;
      if (s.done < total) break;
      if (s.id) {
        auto it = requests_.find(s.id);
        if (it != requests_.end()) it->second.done = true;
      }
      c.sendq.pop_front();
    }
    if (static_cast<size_t>(n) < want) {
      c.writable = false;  // a short write means the socket buffer is full: wait for EPOLLOUT
      break;
    }
  }
  return progressed;
}

bool TcpTransport::ReadSome(Conn& c) {
  bool progressed = false;
  while (c.fd && c.Readable() && c.rstate != RState::kStalled && !awaited_done_) {
    if (c.st_begin < c.st_end &&
        (c.rstate == RState::kPayload || c.st_end - c.st_begin >= sizeof(FrameHeader))) {
      ParseStaging(c);
      progressed = true;
      continue;
    }
    if (!c.readable) break;
    ssize_t n;
    size_t asked;
    size_t need = 0;
    if (c.rstate == RState::kPayload && c.discard) {
      // A payload nobody wants any more: read it into the staging buffer and drop it.
      need = c.dst_len - c.dst_have;
      c.st_begin = c.st_end = 0;
      asked = std::min(need, kStagingBytes);
      n = ::recv(c.fd.get(), c.staging.get(), asked, MSG_DONTWAIT);
      if (n > 0) {
        c.dst_have += static_cast<size_t>(n);
        if (static_cast<size_t>(n) < asked) c.readable = false;
        if (c.dst_have == c.dst_len) FinishPayload(c);
        progressed = true;
        continue;
      }
    } else if (c.rstate == RState::kPayload) {
      // Straight into the destination; the staging buffer catches what follows the frame.
      need = c.dst_len - c.dst_have;
      c.st_begin = c.st_end = 0;
      iovec iov[2] = {{c.dst + c.dst_have, need}, {c.staging.get(), kTailBytes}};
      asked = need + kTailBytes;
      n = ::readv(c.fd.get(), iov, 2);
    } else {
      // A header, possibly completing a partial one at the front of the staging buffer.
      if (c.st_begin > 0) {
        std::memmove(c.staging.get(), c.staging.get() + c.st_begin, c.st_end - c.st_begin);
        c.st_end -= c.st_begin;
        c.st_begin = 0;
      }
      asked = std::min(kHeaderReadBytes, kStagingBytes - c.st_end);
      n = ::recv(c.fd.get(), c.staging.get() + c.st_end, asked, MSG_DONTWAIT);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        c.readable = false;
        break;
      }
      int err = errno;
      HandleEof(c, err == ECONNRESET ? std::string("reset the connection (process killed?)")
                                     : StrCat("receive failed: ", ErrnoText(err)));
      return true;
    }
    if (n == 0) {
      HandleEof(c, "closed the connection without a goodbye (process exited or crashed?)");
      return true;
    }
    progressed = true;
    size_t got = static_cast<size_t>(n);
    if (got < asked) c.readable = false;  // short read: the socket is drained for now
    if (c.rstate == RState::kPayload) {
      if (got < need) {
        c.dst_have += got;
      } else {
        c.dst_have = c.dst_len;
        c.st_begin = 0;
        c.st_end = got - need;
        FinishPayload(c);
      }
    } else {
      c.st_end += got;
      ParseStaging(c);
    }
  }
  return progressed;
}

void TcpTransport::ParseStaging(Conn& c) {
  while (c.st_begin < c.st_end && c.fd && c.Readable() && !awaited_done_) {
    if (c.rstate == RState::kHeader) {
      if (c.st_end - c.st_begin < sizeof(FrameHeader)) return;  // wait for the rest
      std::memcpy(&c.hdr, c.staging.get() + c.st_begin, sizeof(FrameHeader));
      c.st_begin += sizeof(FrameHeader);
      BeginPayload(c);
      continue;
    }
    if (c.rstate == RState::kStalled) return;
    size_t take = std::min(c.st_end - c.st_begin, c.dst_len - c.dst_have);
    if (take && !c.discard) std::memcpy(c.dst + c.dst_have, c.staging.get() + c.st_begin, take);
    c.st_begin += take;
    c.dst_have += take;
    if (c.dst_have == c.dst_len) FinishPayload(c);
  }
  if (c.st_begin == c.st_end) c.st_begin = c.st_end = 0;
}

void TcpTransport::BeginPayload(Conn& c) {
  const FrameHeader& h = c.hdr;
  if (const std::string problem = internal::FrameHeaderProblem(h); !problem.empty()) {
    FailConn(c, problem);
    return;
  }
  c.dst_have = 0;
  c.dst_len = h.length;
  c.dst_id = 0;
  c.discard = false;
  if (h.type == internal::kFrameData && !broken_.empty()) {
    c.discard = true;  // aborted: posted buffers may be gone, and nobody will ask for this
    c.dst = nullptr;
  } else if (h.type == internal::kFrameData) {
    auto it = std::find_if(c.posted.begin(), c.posted.end(),
                           [&](const RecvItem& r) { return r.tag == h.tag; });
    if (it != c.posted.end()) {
      if (it->len != h.length) {
        FailConn(c, StrCat("sent ", h.length, " bytes for tag 0x", std::hex, h.tag, std::dec,
                           " where ", it->len, " were expected (mismatched collective calls?)"));
        return;
      }
      c.dst = it->data;
      c.dst_id = it->id;
      c.posted.erase(it);
    } else if ((h.length <= internal::kMaxBufferedFrame &&
                c.unexpected_bytes + h.length <= internal::kMaxUnexpectedBytes) ||
               (c.hangup && h.length <= internal::kMaxUnexpectedFrame)) {
      c.body.resize(h.length);
      c.dst = c.body.data();
    } else if (c.hangup) {
      FailConn(c, StrCat("closed the connection with ", h.length,
                         " unreceived bytes in flight (tag 0x", std::hex, h.tag, ")"));
      return;
    } else {
      c.rstate = RState::kStalled;  // back-pressure until the matching receive is posted
      return;
    }
  } else {
    // A control frame (abort, goodbye, status), no longer than kMaxControlPayload.
    c.body.resize(h.length);
    c.dst = c.body.data();
  }
  c.rstate = RState::kPayload;
  if (c.dst_len == 0) FinishPayload(c);
}

void TcpTransport::FinishPayload(Conn& c) {
  c.rstate = RState::kHeader;
  if (c.discard) {
    c.discard = false;
  } else if (c.hdr.type == internal::kFrameData) {
    if (c.dst_id) {
      auto it = requests_.find(c.dst_id);
      if (it != requests_.end()) it->second.done = true;
      if (c.dst_id == awaited_) awaited_done_ = true;
    } else {
      c.unexpected_bytes += c.body.size();
      c.unexpected.push_back(Unexpected{c.hdr.tag, std::move(c.body)});
      c.body = {};
    }
  } else {
    HandleControl(c);
  }
  c.dst = nullptr;
  c.dst_id = 0;
}

void TcpTransport::HandleControl(Conn& c) {
  try {
    switch (c.hdr.type) {
      case internal::kFrameGoodbye:
        if (c.state == ConnState::kOpen) c.state = ConnState::kGoodbye;
        break;
      case internal::kFrameAbort: {
        const internal::AbortPayload abort =
            internal::ParseAbortPayload(c.body.data(), c.body.size());
        int root = abort.root;
        const uint64_t seq = abort.seq;
        const std::string& reason = abort.reason;
        // An aborting rank was inside operation `seq`: that answers a status query too.
        c.status.responded = true;
        c.status.ops_started = seq;
        c.status.ops_finished = seq > 0 ? seq - 1 : 0;
        if (root < 0 || root >= size_) root = c.peer;
        c.state = ConnState::kAborted;
        std::string what = root == c.peer
                               ? StrCat("aborted: ", reason)
                               : StrCat("failed, as reported by rank ", c.peer, ": ", reason);
        failures_.push_back(Failure{root, what, true});
        FailPending(c, StrCat("rank ", c.peer, " aborted"));
        break;
      }
      case internal::kFrameStatusReq: {
        internal::ByteWriter w;
        w.U64(ops_started_.load(std::memory_order_relaxed));
        w.U64(ops_finished_.load(std::memory_order_relaxed));
        if (c.state == ConnState::kOpen) {
          QueueControl(c, internal::kFrameStatusReply, c.hdr.tag, w.bytes());
        }
        break;
      }
      case internal::kFrameStatusReply: {
        const internal::StatusPayload status =
            internal::ParseStatusPayload(c.body.data(), c.body.size());
        c.status.responded = true;
        c.status.ops_started = status.ops_started;
        c.status.ops_finished = status.ops_finished;
        break;
      }
      default:
        break;
    }
  } catch (const Error& e) {
    FailConn(c, StrCat("sent a malformed ", FrameTypeName(c.hdr.type), " frame: ", e.what()));
  }
  c.body.clear();
}

void TcpTransport::QueueControl(Conn& c, internal::FrameType type, uint64_t tag,
                                std::string payload) {
  SendItem s;
  s.header = internal::MakeHeader(type, tag, payload.size());
  s.owned = std::move(payload);
  s.len = s.owned.size();
  c.sendq.push_back(std::move(s));
  // std::deque never moves its elements on push_back, so data may point into owned now.
  c.sendq.back().data = c.sendq.back().owned.data();
}

void TcpTransport::HandleEof(Conn& c, const std::string& how) {
  if (c.state == ConnState::kGoodbye || c.state == ConnState::kAborted) {
    // Expected after a goodbye or an abort: the peer has left (its abort is already recorded).
    std::string why = c.state == ConnState::kGoodbye
                          ? StrCat("rank ", c.peer, " has shut down its communicator")
                          : StrCat("rank ", c.peer, " aborted");
    c.state = ConnState::kClosed;
    FailPending(c, why);
    c.fd.Reset();
    return;
  }
  FailConn(c, how);
}

void TcpTransport::FailConn(Conn& c, const std::string& why) {
  if (c.state == ConnState::kFailed || c.state == ConnState::kClosed) return;
  c.state = ConnState::kFailed;
  failures_.push_back(Failure{c.peer, why, false});
  FailPending(c, StrCat("rank ", c.peer, " ", why));
  c.fd.Reset();
}

void TcpTransport::FailPending(Conn& c, const std::string& why) {
  auto fail = [&](RequestId id) {
    auto it = requests_.find(id);
    if (it != requests_.end() && !it->second.done) {
      it->second.failed = true;
      it->second.error = why;
    }
  };
  for (auto& r : c.posted) fail(r.id);
  c.posted.clear();
  if (c.dst_id) fail(c.dst_id);
  c.dst_id = 0;
  for (auto& s : c.sendq) {
    if (s.id) fail(s.id);
  }
  if (c.state != ConnState::kGoodbye && c.state != ConnState::kOpen) c.sendq.clear();
  c.rstate = RState::kHeader;
  c.st_begin = c.st_end = 0;
}

void TcpTransport::ThrowFailureLocked() {
  if (!broken_.empty()) throw Error(ErrorKind::kPeerFailure, broken_, broken_rank_);
  // Let frames already in the sockets land first: an abort notice names the root cause.
  ProgressLocked();
  const Failure* pick = nullptr;
  for (const auto& f : failures_) {
    if (!f.notice) {
      pick = &f;
      break;
    }
  }
  if (!pick && !failures_.empty()) pick = &failures_.front();
  if (pick)
    throw Error(ErrorKind::kPeerFailure, StrCat("rank ", pick->rank, " ", pick->what), pick->rank);
  // A request failed on a connection closed cleanly (the peer shut down its communicator).
  for (const auto& [id, r] : requests_) {
    if (r.failed) throw Error(ErrorKind::kPeerFailure, r.error, r.peer);
  }
  Fail(ErrorKind::kInternal, "failure reported without a cause");
}

void TcpTransport::CheckHealthy() {
  std::lock_guard<std::mutex> lock(io_mu_);
  if (HasFailureLocked()) ThrowFailureLocked();
}

std::vector<PeerStatus> TcpTransport::QueryStatus(Deadline deadline) {
  std::unique_lock<std::mutex> lock(io_mu_);
  uint64_t seq = ops_started_.load(std::memory_order_relaxed);
  std::vector<PeerStatus> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    out[static_cast<size_t>(r)].rank = r;
    Conn* c = conns_[static_cast<size_t>(r)].get();
    if (!c) continue;
    c->status = PeerStatus{};
    c->status.rank = r;
    if (c->state == ConnState::kOpen) QueueControl(*c, internal::kFrameStatusReq, seq, {});
  }
  for (;;) {
    bool all = true;
    for (auto& c : conns_) {
      if (c && c->fd && c->Readable() && !c->status.responded) all = false;
    }
    if (all || deadline.Expired()) break;
    if (!ProgressLocked()) BlockForEvents(lock, caller_epfd_.get(), deadline.RemainingMs(20));
  }
  for (int r = 0; r < size_; ++r) {
    Conn* c = conns_[static_cast<size_t>(r)].get();
    if (c) out[static_cast<size_t>(r)] = c->status;
    if (r == rank_) {
      out[static_cast<size_t>(r)].responded = true;
      out[static_cast<size_t>(r)].ops_started = seq;
      out[static_cast<size_t>(r)].ops_finished = ops_finished_.load();
    }
  }
  return out;
}

void TcpTransport::Abort(int root_rank, const std::string& reason) {
  std::unique_lock<std::mutex> lock(io_mu_);
  if (!broken_.empty()) return;
  broken_ = StrCat("the transport was aborted: ", reason);
  broken_rank_ = root_rank;
  // Forget every posted receive: their buffers belong to the caller again. A payload being
  // received into one is read to its end and dropped.
  for (auto& c : conns_) {
    if (!c) continue;
    for (auto& r : c->posted) {
      auto it = requests_.find(r.id);
      if (it != requests_.end()) {
        it->second.failed = true;
        it->second.error = "aborted";
      }
    }
    c->posted.clear();
    if (c->rstate == RState::kPayload && c->dst_id != 0) {
      c->discard = true;
      c->dst_id = 0;
      c->dst = nullptr;
    }
    if (c->rstate == RState::kStalled) BeginPayload(*c);
  }
  internal::ByteWriter w;
  w.U32(static_cast<uint32_t>(root_rank));
  w.U64(ops_started_.load(std::memory_order_relaxed));
  w.Str(reason.size() > 4000 ? reason.substr(0, 4000) : reason);
  for (auto& c : conns_) {
    if (!c) continue;
    // Drop queued data (it is moot) but keep a partly written frame, so the stream stays
    // framed, and control frames such as status replies a peer is waiting for. The caller may
    // free its buffers once we return, so the rest of a partly written frame is copied.
    std::deque<SendItem> keep;
    for (size_t i = 0; i < c->sendq.size(); ++i) {
      SendItem& s = c->sendq[i];
      if (s.id == 0) {
        keep.push_back(std::move(s));
        keep.back().data = keep.back().owned.data();
        continue;
      }
      auto it = requests_.find(s.id);
      if (it != requests_.end()) {
        it->second.failed = true;
        it->second.error = "aborted";
      }
      if (i == 0 && s.done > 0) {
        size_t from = s.done > sizeof(FrameHeader) ? s.done - sizeof(FrameHeader) : 0;
        SendItem rest;
        rest.header = s.header;
        rest.done = s.done;
        rest.len = s.len;
        rest.owned.assign(s.data + from, s.len - from);
        rest.payload_base = from;
        keep.push_back(std::move(rest));
        keep.back().data = keep.back().owned.data();
      }
    }
    c->sendq.swap(keep);
    if (c->state == ConnState::kOpen && c->fd)
      QueueControl(*c, internal::kFrameAbort, 0, w.bytes());
  }
  Deadline flush = Deadline::After(std::chrono::milliseconds(300));
  for (;;) {
    bool pending = false;
    for (auto& c : conns_) {
      if (c && c->fd && c->state == ConnState::kOpen && !c->sendq.empty()) pending = true;
    }
    if (!pending || flush.Expired()) break;
    if (!ProgressLocked()) BlockForEvents(lock, caller_epfd_.get(), 10);
  }
}

void TcpTransport::ProgressThreadLoop() {
  epoll_event events[64];
  while (!stop_.load()) {
    if (drivers_.load(std::memory_order_acquire) > 0) {
      // A driver does the IO; look again in a while (no busy waiting, no wake-ups per op).
      std::unique_lock<std::mutex> lock(park_mu_);
      park_cv_.wait_for(lock, std::chrono::milliseconds(20));
      continue;
    }
    int n = ::epoll_wait(thread_epfd_.get(), events, 64, 50);
    if (stop_.load()) break;
    std::unique_lock<std::mutex> lock(io_mu_);
    if (n > 0) ApplyEvents(events, n);
    if (drivers_.load(std::memory_order_acquire) > 0) continue;
    while (ProgressLocked()) {
    }
  }
}

}  // namespace

std::unique_ptr<Transport> CreateTcpTransport(const TcpTransportOptions& options) {
  return std::make_unique<TcpTransport>(options);
}

std::string InterfaceAddress(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) Fail(ErrorKind::kSystem, "getifaddrs: ", ErrnoText(errno));
  std::string found, names;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    if (names.find(std::string(a->ifa_name) + " ") == std::string::npos) {
      names += std::string(a->ifa_name) + " ";
    }
    if (ifname == a->ifa_name && found.empty()) {
      char buf[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf,
                  sizeof(buf));
      found = buf;
    }
  }
  ::freeifaddrs(list);
  if (found.empty()) {
    Fail(ErrorKind::kConfig, "CORTADO_SOCKET_IFNAME='", ifname,
         "' has no IPv4 address; interfaces with one: ", names);
  }
  return found;
}

std::string RouteAddressTo(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) {
    Fail(ErrorKind::kConfig, "cannot resolve master address '", host, "' to IPv4");
  }
  sockaddr_in target = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  if ((ntohl(target.sin_addr.s_addr) >> 24) == 127) return "127.0.0.1";
  Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (!fd || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&target), sizeof(target)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    Fail(ErrorKind::kConfig, "no route to master address '", host,
         "'; set CORTADO_SOCKET_IFNAME to the interface to use");
  }
  char buf[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
  return buf;
}

}  // namespace cortado::dist
