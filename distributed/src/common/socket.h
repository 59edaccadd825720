// Internal: thin helpers over POSIX sockets (IPv4/IPv6 TCP) with deadlines, and a little-endian
// byte writer/reader for the handshake and store messages. Not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "cortado/dist/deadline.h"
#include "cortado/dist/error.h"

namespace cortado::dist::internal {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

std::string ErrnoText(int err);

// Binds and listens on host:port (host "" or "0.0.0.0": any IPv4; port 0: a free one).
Fd ListenTcp(const std::string& host, int port, int backlog = 128);
int LocalPort(int fd);
// Connects to host:port once within the deadline; returns an invalid Fd on a refused or
// unreachable peer (errno text in *why), throws kConfig when host does not resolve.
Fd TryConnectTcp(const std::string& host, int port, Deadline deadline, std::string* why);
// Retries TryConnectTcp until the deadline; throws kTimeout with `what` and the last reason.
Fd ConnectTcpRetry(const std::string& host, int port, Deadline deadline, const std::string& what);

void SetNonBlocking(int fd, bool on);
void SetNoDelay(int fd);
void SetBuffers(int fd, int bytes);  // no-op for bytes <= 0
// SO_RCVLOWAT: the socket reports readable (and wakes its waiters) only once `bytes` are queued,
// or on end of stream, an error, or when the receive window can take no more (the kernel's guard
// against a mark larger than the peer can send).
void SetReceiveLowWater(int fd, int bytes);
void SetKeepAlive(int fd);  // keepalive + TCP_USER_TIMEOUT, for dead hosts
void SetCloseOnExec(int fd, bool on);

// Blocking transfers on a (possibly non-blocking) socket, bounded by the deadline. ReadFull
// returns false on a clean EOF before any byte; both throw kTimeout / kPeerFailure otherwise.
void WriteFull(int fd, const void* data, size_t len, Deadline deadline, const char* what);
bool ReadFull(int fd, void* data, size_t len, Deadline deadline, const char* what);

class ByteWriter {
 public:
  void U8(uint8_t v) { bytes_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void I64(int64_t v) { Raw(&v, 8); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    bytes_ += s;
  }
  void Raw(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Reads fields; every read checks the bounds and throws kProtocol with `what` when short.
class ByteReader {
 public:
  ByteReader(const char* data, size_t len, const char* what)
      : p_(data), end_(data + len), what_(what) {}
  uint8_t U8() { return Get<uint8_t>(); }
  uint16_t U16() { return Get<uint16_t>(); }
  uint32_t U32() { return Get<uint32_t>(); }
  uint64_t U64() { return Get<uint64_t>(); }
  int64_t I64() { return Get<int64_t>(); }
  std::string Str(size_t max_len) {
    uint32_t n = U32();
    if (n > max_len || n > Left()) Fail(ErrorKind::kProtocol, what_, ": string too long");
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  size_t Left() const { return static_cast<size_t>(end_ - p_); }

 private:
  template <typename T>
  T Get() {
    if (Left() < sizeof(T)) Fail(ErrorKind::kProtocol, what_, ": message too short");
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  const char* p_;
  const char* end_;
  const char* what_;
};

}  // namespace cortado::dist::internal
