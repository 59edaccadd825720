// The TCP transport's IO state machine: framed writes (sendmsg with iovecs), reads straight into
// posted buffers with a staging buffer for headers, unexpected messages, back-pressure (a stalled
// frame waits for its receive), control frames, and how a connection fails.
#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "cortado/dist/error.h"
#include "transport/tcp/tcp_transport.h"

namespace cortado::dist::tcp {

std::string SizeMismatch(size_t sent, uint64_t tag, size_t expected) {
  return StrCat("sent ", sent, " bytes for tag 0x", std::hex, tag, std::dec, " where ", expected,
                " were expected (mismatched collective calls?)");
}

void TcpTransport::UpdateLowWaterLocked() {
  for (auto& cp : conns_) {
    if (!cp || !cp->fd) continue;
    Conn& c = *cp;
    int want = 1;
    // The rest of a payload under way will come (or the connection ends, which wakes anyway).
    // Not when the peer has hung up: it may have sent less, and we read to the end.
    if (c.rstate == RState::kPayload && c.Readable() && !c.hangup && c.dst_len > c.dst_have) {
      want = static_cast<int>(std::min(c.dst_len - c.dst_have, kMaxLowWater));
    }
    if (want != c.low_water) {
      internal::SetReceiveLowWater(c.fd.get(), want);
      c.low_water = want;
    }
  }
}

int TcpTransport::BlockForEvents(std::unique_lock<std::mutex>& lock, int epfd, int timeout_ms) {
  epoll_event events[64];
  if (timeout_ms != 0) UpdateLowWaterLocked();
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
      // A peer that gave up on another rank's failure sends its abort and exits; our send can
      // fail before we have read that abort, which names the root cause. Read what it sent
      // first, so the rank that merely left is not blamed (its abort makes the EOF expected).
      // (Even when the awaited request has just completed, which otherwise stops reading.)
      c.readable = true;
      c.hangup = true;
      if (c.rstate == RState::kStalled) BeginPayload(c);
      const bool awaited_done = std::exchange(awaited_done_, false);
      while (c.fd && c.state == ConnState::kOpen && ReadSome(c)) {
      }
      awaited_done_ = awaited_done_ || awaited_done;
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
        FailConn(c, SizeMismatch(h.length, h.tag, it->len));
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
        if (root < 0 || root >= size()) root = c.peer;
        c.state = ConnState::kAborted;
        std::string what = root == c.peer
                               ? StrCat("aborted: ", reason)
                               : StrCat("failed, as reported by rank ", c.peer, ": ", reason);
        failures_.push_back(Failure{root, what, true});
        unhealthy_.store(true, std::memory_order_release);
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
  unhealthy_.store(true, std::memory_order_release);
  FailPending(c, StrCat("rank ", c.peer, " ", why));
  c.fd.Reset();
}

void TcpTransport::FailPending(Conn& c, const std::string& why) {
  for (auto& r : c.posted) MarkFailed(r.id, why);
  c.posted.clear();
  if (c.dst_id) MarkFailed(c.dst_id, why);
  c.dst_id = 0;
  for (auto& s : c.sendq) {
    if (s.id) MarkFailed(s.id, why);
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

}  // namespace cortado::dist::tcp
