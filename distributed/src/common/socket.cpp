// Socket helpers; see socket.h.
#include "common/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace cortado::dist::internal {

void Fd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer.
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return msg;
}

namespace {

struct AddrList {
  addrinfo* head = nullptr;
  ~AddrList() {
    if (head) freeaddrinfo(head);
  }
};

void Resolve(const std::string& host, int port, bool passive, AddrList* out) {
  addrinfo hints{};
  hints.ai_family = host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->head);
  if (rc != 0) {
    Fail(ErrorKind::kConfig, "cannot resolve host '", host, "': ", gai_strerror(rc));
  }
}

}  // namespace

Fd ListenTcp(const std::string& host, int port, int backlog) {
  AddrList addrs;
  Resolve(host == "0.0.0.0" ? "" : host, port, true, &addrs);
  std::string last;
  for (addrinfo* a = addrs.head; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      last = ErrnoText(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
      last = ErrnoText(errno);
      continue;
    }
    return fd;
  }
  Fail(ErrorKind::kSystem, "cannot listen on ", host.empty() ? "*" : host, ":", port, ": ", last);
}

int LocalPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    Fail(ErrorKind::kSystem, "getsockname: ", ErrnoText(errno));
  }
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

Fd TryConnectTcp(const std::string& host, int port, Deadline deadline, std::string* why) {
  AddrList addrs;
  Resolve(host, port, false, &addrs);
  for (addrinfo* a = addrs.head; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) {
      *why = ErrnoText(errno);
      continue;
    }
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int n = ::poll(&p, 1, deadline.RemainingMs(60000));
      if (n <= 0) {
        *why = n == 0 ? "connect timed out" : ErrnoText(errno);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      *why = ErrnoText(errno);
      continue;
    }
    SetNonBlocking(fd.get(), false);
    return fd;
  }
  return Fd();
}

Fd ConnectTcpRetry(const std::string& host, int port, Deadline deadline, const std::string& what) {
  std::string why = "no address";
  auto pause = std::chrono::milliseconds(5);
  for (;;) {
    Fd fd = TryConnectTcp(host, port, deadline, &why);
    if (fd) return fd;
    if (deadline.Expired()) {
      throw Error(ErrorKind::kTimeout, StrCat(what, ": cannot connect to ", host, ":", port,
                                              " before the deadline (", why, ")"));
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(200)) pause *= 2;
  }
}

void SetNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) Fail(ErrorKind::kSystem, "fcntl: ", ErrnoText(errno));
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, flags) != 0) Fail(ErrorKind::kSystem, "fcntl: ", ErrnoText(errno));
}

void SetCloseOnExec(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFD, 0);
  if (flags < 0) Fail(ErrorKind::kSystem, "fcntl: ", ErrnoText(errno));
  flags = on ? (flags | FD_CLOEXEC) : (flags & ~FD_CLOEXEC);
  ::fcntl(fd, F_SETFD, flags);
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void SetBuffers(int fd, int bytes) {
  if (bytes <= 0) return;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void SetReceiveLowWater(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes));
}

void SetKeepAlive(int fd) {
  // A peer host that vanishes without closing (power loss, partition) is found by keepalive
  // probes when idle and by TCP_USER_TIMEOUT when sent data stays unacknowledged.
  int one = 1, idle = 10, interval = 2, count = 5;
  unsigned int user_timeout_ms = 30000;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

namespace {

// Waits for fd to be ready for `events`, a second at most (polls are short so the caller looks
// again); throws kTimeout, "<what>: <late>", once the deadline has passed.
void AwaitReady(int fd, short events, Deadline deadline, const char* what, const char* late) {
  pollfd pfd{fd, events, 0};
  int rc = ::poll(&pfd, 1, deadline.RemainingMs(1000));
  if (rc == 0 && deadline.Expired()) throw Error(ErrorKind::kTimeout, StrCat(what, ": ", late));
}

}  // namespace

void WriteFull(int fd, const void* data, size_t len, Deadline deadline, const char* what) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      AwaitReady(fd, POLLOUT, deadline, what, "send timed out");
      continue;
    }
    throw Error(ErrorKind::kPeerFailure, StrCat(what, ": send failed: ", ErrnoText(errno)));
  }
}

bool ReadFull(int fd, void* data, size_t len, Deadline deadline, const char* what) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < len) {
    ssize_t n = ::recv(fd, p + got, len - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      if (got == 0) return false;
      throw Error(ErrorKind::kPeerFailure, StrCat(what, ": connection closed mid-message"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      AwaitReady(fd, POLLIN, deadline, what, "no reply before the deadline");
      continue;
    }
    throw Error(ErrorKind::kPeerFailure, StrCat(what, ": receive failed: ", ErrnoText(errno)));
  }
  return true;
}

}  // namespace cortado::dist::internal
