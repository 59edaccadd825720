// One connection of the TCP mesh being set up; see handshake.h.
#include "transport/tcp/handshake.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "cortado/dist/error.h"
#include "transport/tcp/frames.h"

namespace cortado::dist::tcp {
namespace {

using internal::FrameHeader;

// A dial refused at once (the peer may not listen yet) is tried again after this pause.
constexpr auto kRedialPause = std::chrono::milliseconds(50);
// How long an accepted connection may stay silent before it is dropped.
constexpr auto kHelloTimeout = std::chrono::seconds(10);

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

// A non-blocking connect to an IPv4 host:port; an invalid Fd when refused at once.
internal::Fd StartConnect(const std::string& address) {
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
  internal::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) Fail(ErrorKind::kSystem, "socket: ", internal::ErrnoText(errno));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 &&
      errno != EINPROGRESS) {
    return internal::Fd();
  }
  return fd;
}

std::string FrameBytes(internal::FrameType type, const std::string& payload) {
  FrameHeader h = internal::MakeHeader(type, 0, payload.size());
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  return out + payload;
}

}  // namespace

Handshake Handshake::Dial(int peer, const std::string& address) {
  Handshake h(State::kConnecting, /*inbound=*/false);
  h.peer_ = peer;
  h.address_ = address;
  h.fd_ = StartConnect(address);
  if (!h.fd_) h.redial_at_ = Clock::now() + kRedialPause;
  return h;
}

Handshake Handshake::Accept(internal::Fd fd) {
  Handshake h(State::kAwaitingHello, /*inbound=*/true);
  h.fd_ = std::move(fd);
  h.expires_ = Deadline::After(kHelloTimeout);
  return h;
}

bool Handshake::PollFor(pollfd* p) {
  if (state_ == State::kConnecting && !fd_) {
    if (Clock::now() < redial_at_) return false;
    fd_ = StartConnect(address_);
    if (!fd_) {
      redial_at_ = Clock::now() + kRedialPause;
      return false;
    }
  }
  *p = pollfd{fd_.get(), static_cast<short>(state_ == State::kConnecting ? POLLOUT : POLLIN), 0};
  return true;
}

Step Handshake::OnReady(const HandshakeContext& context) {
  switch (state_) {
    case State::kConnecting:
      return OnConnecting(context);
    case State::kAwaitingAck:
      return OnAwaitingAck(context);
    case State::kAwaitingHello:
      return OnAwaitingHello(context);
  }
  return Step::kDrop;
}

Step Handshake::OnConnecting(const HandshakeContext& context) {
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return Redial();  // refused or unreachable: the peer may not listen yet
  internal::HelloPayload hello = context.mine;
  hello.to_rank = static_cast<uint32_t>(peer_);
  const std::string bytes = FrameBytes(
      internal::kFrameHello, std::string(reinterpret_cast<const char*>(&hello), sizeof(hello)));
  internal::WriteFull(fd_.get(), bytes.data(), bytes.size(), context.deadline, "transport hello");
  state_ = State::kAwaitingAck;
  return Step::kRetry;
}

Step Handshake::OnAwaitingAck(const HandshakeContext& context) {
  const bool open = ReadFrame();
  FrameHeader fh{};
  std::string payload;
  bool complete = false;
  try {
    complete = internal::ParseHandshakeFrame(in_, &fh, &payload);
  } catch (const Error& e) {
    Fail(ErrorKind::kProtocol, "rank ", context.rank, ": rank ", peer_, " answered the hello with ",
         e.what());
  }
  if (!complete) {
    // A peer that closes before answering (e.g. a stale listener) is dialed again.
    return open ? Step::kRetry : Redial();
  }
  if (fh.type == internal::kFrameReject) {
    throw Error(ErrorKind::kRejected,
                StrCat("rank ", peer_, " rejected rank ", context.rank, ": ", payload), peer_,
                "connect");
  }
  if (fh.type != internal::kFrameHelloAck) {
    Fail(ErrorKind::kProtocol, "rank ", peer_, " answered the hello with a ",
         internal::FrameTypeName(fh.type), " frame");
  }
  return Step::kEstablished;
}

Step Handshake::OnAwaitingHello(const HandshakeContext& context) {
  const bool open = ReadFrame();
  std::string reject;
  internal::HelloPayload hello{};
  try {
    FrameHeader fh{};
    std::string payload;
    if (!internal::ParseHandshakeFrame(in_, &fh, &payload)) {
      return open ? Step::kRetry : Step::kDrop;
    }
    if (fh.type != internal::kFrameHello || payload.size() != sizeof(hello)) {
      reject = StrCat("expected a hello frame, got ", internal::FrameTypeName(fh.type));
    } else {
      std::memcpy(&hello, payload.data(), sizeof(hello));
      const bool connected = hello.from_rank < static_cast<uint32_t>(context.size) &&
                             context.connected(static_cast<int>(hello.from_rank));
      reject = internal::HelloRejection(hello, context.mine, context.rank, context.size, connected);
    }
  } catch (const Error& e) {
    reject = e.what();
  }
  if (!reject.empty()) {
    const std::string bytes = FrameBytes(internal::kFrameReject, reject);
    (void)!::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    return Step::kDrop;
  }
  const std::string ack = FrameBytes(internal::kFrameHelloAck, {});
  internal::WriteFull(fd_.get(), ack.data(), ack.size(), context.deadline, "transport hello ack");
  peer_ = static_cast<int>(hello.from_rank);
  return Step::kEstablished;
}

Step Handshake::Redial() {
  fd_.Reset();
  in_.clear();
  state_ = State::kConnecting;
  redial_at_ = Clock::now() + kRedialPause;
  return Step::kRetry;
}

// Never reads past the handshake frame: data frames may follow it at once, and they belong to
// the connection's stream.
bool Handshake::ReadFrame() {
  for (;;) {
    size_t want = sizeof(FrameHeader);
    if (in_.size() >= sizeof(FrameHeader)) {
      FrameHeader h;
      std::memcpy(&h, in_.data(), sizeof(h));
      if (h.magic != internal::kFrameMagic || h.length > internal::kMaxControlPayload) return true;
      want += h.length;
    }
    if (in_.size() >= want) return true;
    char buf[4096];
    const size_t ask = std::min(sizeof(buf), want - in_.size());
    const ssize_t n = ::recv(fd_.get(), buf, ask, MSG_DONTWAIT);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return false;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
}

}  // namespace cortado::dist::tcp
