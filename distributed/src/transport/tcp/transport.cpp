// The TCP transport object: construction and shutdown, posting and completion (Wait spins
// briefly, then sleeps in epoll_wait), operation brackets, status queries, Abort, the progress
// thread; and the address helpers (InterfaceAddress, RouteAddressTo).
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "cortado/dist/error.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport_internal.h"

namespace cortado::dist {
namespace tcp {

TcpTransport::TcpTransport(const TcpTransportOptions& options)
    : Transport(options.rank, options.identity.world_size), options_(options) {
  if (size() < 1 || rank() < 0 || rank() >= size()) {
    Fail(ErrorKind::kInvalidArgument, "tcp transport: rank ", rank(), " outside world of ", size());
  }
  std::string host = options.listen_host.empty() ? "0.0.0.0" : options.listen_host;
  listen_fd_ = internal::ListenTcp(host, 0, std::max(128, size()));
  std::string shown = host == "0.0.0.0" ? "127.0.0.1" : host;
  address_ = StrCat(shown, ":", internal::LocalPort(listen_fd_.get()));
  conns_.resize(static_cast<size_t>(size()));
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
// Posting and completion.

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

RequestId TcpTransport::FailedRequest(int peer, const std::string& why) {
  const RequestId id = NewRequest(peer);
  MarkFailed(id, why);
  return id;
}

void TcpTransport::MarkFailed(RequestId id, const std::string& why) {
  auto it = requests_.find(id);
  if (it != requests_.end() && !it->second.done) {
    it->second.failed = true;
    it->second.error = why;
  }
}

RequestId TcpTransport::PostSend(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                                 uint64_t tag) {
  internal::CheckTransfer(region, offset, bytes, peer, rank(), size());
  std::lock_guard<std::mutex> lock(io_mu_);
  Conn* c = PeerConn(peer, "PostSend");
  if (c->state != ConnState::kOpen) {
    return FailedRequest(peer, StrCat("rank ", peer, " is no longer connected"));
  }
  const RequestId id = NewRequest(peer);
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
  internal::CheckTransfer(region, offset, bytes, peer, rank(), size());
  std::lock_guard<std::mutex> lock(io_mu_);
  Conn* c = PeerConn(peer, "PostRecv");
  char* dst = static_cast<char*>(region.data()) + offset;
  // A message that already arrived unexpectedly is copied out now.
  auto unexpected = std::find_if(c->unexpected.begin(), c->unexpected.end(),
                                 [&](const Unexpected& u) { return u.tag == tag; });
  if (unexpected != c->unexpected.end()) return TakeUnexpected(*c, unexpected, dst, bytes);
  if (!c->Readable()) return FailedRequest(peer, StrCat("rank ", peer, " is no longer connected"));
  // The message may be arriving right now as an unexpected one: take it over, moving what has
  // arrived so far, and let the rest land in place.
  if (c->rstate == RState::kPayload && c->hdr.type == internal::kFrameData && c->dst_id == 0 &&
      !c->discard && c->hdr.tag == tag) {
    if (c->dst_len != bytes) {
      return FailedRequest(peer, StrCat("rank ", peer, " ", SizeMismatch(c->dst_len, tag, bytes)));
    }
    if (c->dst_have) std::memcpy(dst, c->body.data(), c->dst_have);
    c->body = {};
    c->dst = dst;
    c->dst_id = NewRequest(peer);
    return c->dst_id;
  }
  const RequestId id = NewRequest(peer);
  c->posted.push_back(RecvItem{id, tag, dst, bytes});
  if (c->rstate == RState::kStalled) BeginPayload(*c);  // the stalled frame may be this one
  if (drivers_.load(std::memory_order_relaxed) == 0) WakeProgressThread();
  return id;
}

RequestId TcpTransport::TakeUnexpected(Conn& c, std::deque<Unexpected>::iterator message, char* dst,
                                       size_t bytes) {
  const RequestId id = NewRequest(c.peer);
  if (message->data.size() != bytes) {
    MarkFailed(
        id, StrCat("rank ", c.peer, " ", SizeMismatch(message->data.size(), message->tag, bytes)));
  } else {
    if (bytes) std::memcpy(dst, message->data.data(), bytes);
    requests_[id].done = true;
  }
  c.unexpected_bytes -= message->data.size();
  c.unexpected.erase(message);
  if (c.rstate == RState::kStalled) BeginPayload(c);
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
  const bool spin = options_.spin_us > 0 && spin_policy_.ShouldSpin();
  bool polled = false;  // it polled before sleeping (SpinPolicy learns from such waits)
  bool slept = false;
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
      if (polled) spin_policy_.Record(!slept);
      return;
    }
    if (it->second.failed || HasFailureLocked()) ThrowFailureLocked();
    if (ProgressLocked()) continue;
    it = requests_.find(id);
    if (it->second.done || it->second.failed || HasFailureLocked()) continue;
    if (deadline.Expired()) {
      int peer = it->second.peer;
      throw Error(ErrorKind::kTimeout,
                  StrCat("rank ", rank(), ": deadline passed waiting for rank ", peer), peer);
    }
    // Poll before sleeping: a reply on an idle core arrives in microseconds, far sooner than a
    // wake-up from epoll. After the first few microseconds, yield between polls: when the peer
    // shares our core (more ranks than cores, or another busy process), it can then run. Over a
    // slow link the polls would only burn CPU, and SpinPolicy turns them off; a wait that has
    // slept once does not poll again.
    auto now = Clock::now();
    int timeout = 0;
    if (!spin || slept || now >= spin_until) {
      timeout = deadline.RemainingMs(200);
      slept = true;
      wait_sleeps_.fetch_add(1, std::memory_order_relaxed);
    } else {
      polled = true;
      if (now - t_start > std::chrono::microseconds(kBusyPollUs)) {
        lock.unlock();
        sched_yield();
        lock.lock();
      }
    }
    BlockForEvents(lock, caller_epfd_.get(), timeout);
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

void TcpTransport::CheckHealthy() {
  if (!unhealthy_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(io_mu_);
  if (HasFailureLocked()) ThrowFailureLocked();
}

std::vector<PeerStatus> TcpTransport::QueryStatus(Deadline deadline) {
  std::unique_lock<std::mutex> lock(io_mu_);
  uint64_t seq = ops_started_.load(std::memory_order_relaxed);
  std::vector<PeerStatus> out(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    out[static_cast<size_t>(r)].rank = r;
    Conn* c = conns_[static_cast<size_t>(r)].get();
    if (!c) continue;
    // A peer that aborted already answered: its abort said which operation it was in (kept,
    // or a query racing the abort would report it as silent).
    if (c->state == ConnState::kAborted && c->status.responded) continue;
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
  for (int r = 0; r < size(); ++r) {
    Conn* c = conns_[static_cast<size_t>(r)].get();
    if (c) out[static_cast<size_t>(r)] = c->status;
    if (r == rank()) {
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
  unhealthy_.store(true, std::memory_order_release);
  // Forget every posted receive: their buffers belong to the caller again. A payload being
  // received into one is read to its end and dropped.
  for (auto& c : conns_) {
    if (!c) continue;
    for (auto& r : c->posted) MarkFailed(r.id, "aborted");
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
      MarkFailed(s.id, "aborted");
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
    {
      // A driver may have left a payload's low-water mark behind: a small frame (a status
      // query) must wake this thread, not wait for the rest of a payload.
      std::lock_guard<std::mutex> lock(io_mu_);
      UpdateLowWaterLocked();
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

}  // namespace tcp

using internal::ErrnoText;
using internal::Fd;

std::unique_ptr<Transport> CreateTcpTransport(const TcpTransportOptions& options) {
  return std::make_unique<tcp::TcpTransport>(options);
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
