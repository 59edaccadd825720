// The TCP transport's connection setup: dial the lower ranks, accept the higher ones, and check
// every handshake against the job identity (internal::HelloRejection, shared with the store).
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "cortado/dist/error.h"
#include "transport/tcp/tcp_transport.h"

namespace cortado::dist::tcp {

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

}  // namespace cortado::dist::tcp
