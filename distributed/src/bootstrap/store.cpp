// The in-memory store and the TCP store (server and client). Wire format, little endian (parsed
// and written by store_wire.*):
//   hello    client -> server: u32 magic "CDST", u16 version, u64 token digest, u32 world size,
//                              u64 fingerprint, u32 rank
//            server -> client: u8 status (0 ok, 1 rejected), str reason
//   request  u32 body length (<= kMaxStoreMessage), body: u8 command, u32 argc, argc x str,
//            i64 number
//   reply    u32 body length, body: u8 status (0 ok, 1 timeout, 2 rejected/poisoned),
//            str value, i64 number
// A str is u32 length + bytes. Lengths are checked before anything is allocated.
#include "cortado/dist/store.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "bootstrap/store_wire.h"
#include "common/socket.h"
#include "cortado/dist/error.h"

namespace cortado::dist {

using internal::ByteWriter;
using internal::Fd;

namespace {

using internal::kAdd;
using internal::kCheck;
using internal::kGet;
using internal::kMaxStoreKey;
using internal::kMaxStoreMessage;
using internal::kSet;
using internal::kStoreHelloBytes;
using internal::kStoreMagic;
using internal::kStoreOk;
using internal::kStorePoisoned;
using internal::kStoreTimedOut;
using internal::kStoreVersion;
using internal::kWait;

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) out += StrCat(", ... (", keys.size(), " keys)");
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// InMemoryStore

bool InMemoryStore::HasAll(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& k) { return data_.count(k); });
}

void InMemoryStore::WaitLocked(std::unique_lock<std::mutex>& lock,
                               const std::vector<std::string>& keys, Deadline deadline) {
  for (;;) {
    if (!poison_.empty()) throw Error(ErrorKind::kRejected, poison_);
    if (HasAll(keys)) return;
    if (deadline.IsNever()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline.at()) == std::cv_status::timeout) {
      if (!poison_.empty()) throw Error(ErrorKind::kRejected, poison_);
      if (HasAll(keys)) return;
      throw Error(ErrorKind::kTimeout, StrCat("store: timed out waiting for ", JoinKeys(keys)));
    }
  }
}

void InMemoryStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

std::string InMemoryStore::Get(const std::string& key, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitLocked(lock, {key}, deadline);
  return data_[key];
}

void InMemoryStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitLocked(lock, keys, deadline);
}

int64_t InMemoryStore::Add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!poison_.empty()) throw Error(ErrorKind::kRejected, poison_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      try {
        v = std::stoll(it->second);
      } catch (const std::exception&) {
        Fail(ErrorKind::kInvalidArgument, "store: Add on key '", key, "' holding a non-integer");
      }
    }
    v += delta;
    data_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

bool InMemoryStore::Check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!poison_.empty()) throw Error(ErrorKind::kRejected, poison_);
  return HasAll(keys);
}

void InMemoryStore::Poison(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (poison_.empty()) poison_ = reason;
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// TcpStoreServer

TcpStoreServer::TcpStoreServer(JobIdentity identity, const std::string& host, int port,
                               int listen_fd)
    : identity_(std::move(identity)) {
  Fd fd = listen_fd >= 0 ? Fd(listen_fd) : internal::ListenTcp(host, port);
  internal::SetCloseOnExec(fd.get(), true);
  port_ = internal::LocalPort(fd.get());
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) Fail(ErrorKind::kSystem, "eventfd: ", internal::ErrnoText(errno));
  listen_fd_ = fd.Release();
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  store_.Poison("store server is shutting down");
  accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(client_threads_);
  }
  for (auto& t : threads) t.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

int TcpStoreServer::rejected_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rejected_;
}

void TcpStoreServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    client_fds_.push_back(fd);
    client_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

namespace {

// A client's hello. The magic is read first: an HTTP request or another program's hello is
// answered at once, as a hello with that magic (and zeros) that CheckStoreHello refuses.
internal::StoreHello ReadStoreHello(int fd) {
  // The hello must arrive promptly: a connection that sends nothing is dropped.
  const Deadline deadline = Deadline::After(std::chrono::seconds(10));
  char hello[kStoreHelloBytes] = {};
  if (!internal::ReadFull(fd, hello, 4, deadline, "store hello")) {
    throw Error(ErrorKind::kProtocol, "closed before hello");
  }
  uint32_t magic = 0;
  std::memcpy(&magic, hello, 4);
  if (magic == kStoreMagic) {
    internal::ReadFull(fd, hello + 4, kStoreHelloBytes - 4, deadline, "store hello");
  }
  return internal::ParseStoreHello(hello, kStoreHelloBytes);
}

// Best effort: a client that is gone misses the answer.
void ReplyToHello(int fd, bool ok, const std::string& reason) {
  ByteWriter w;
  w.U8(ok ? 0 : 1);
  w.Str(reason);
  try {
    internal::WriteFull(fd, w.bytes().data(), w.bytes().size(),
                        Deadline::After(std::chrono::seconds(2)), "store hello reply");
  } catch (const Error&) {
  }
}

void RequireArgs(const internal::StoreRequest& request, size_t n, const char* what) {
  if (request.args.size() != n) {
    throw Error(ErrorKind::kProtocol,
                StrCat(what, " takes ", n, n == 1 ? " argument" : " arguments"));
  }
}

// Runs one request on the store. A timeout or a poisoned store is the reply; a malformed
// request throws kProtocol, which drops the client.
internal::StoreReply Execute(InMemoryStore& store, const internal::StoreRequest& request) {
  internal::StoreReply reply;
  const std::vector<std::string>& args = request.args;
  try {
    const Deadline deadline = request.number < 0
                                  ? Deadline::Never()
                                  : Deadline::After(std::chrono::milliseconds(request.number));
    switch (request.command) {
      case kSet:
        RequireArgs(request, 2, "SET");
        store.Set(args[0], args[1]);
        break;
      case kGet:
        RequireArgs(request, 1, "GET");
        reply.value = store.Get(args[0], deadline);
        break;
      case kWait:
        store.Wait(args, deadline);
        break;
      case kAdd:
        RequireArgs(request, 1, "ADD");
        reply.number = store.Add(args[0], request.number);
        break;
      case kCheck:
        reply.number = store.Check(args) ? 1 : 0;
        break;
      default:
        throw Error(ErrorKind::kProtocol, StrCat("unknown store command ", int{request.command}));
    }
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kProtocol) throw;
    reply.status = e.kind() == ErrorKind::kTimeout ? kStoreTimedOut : kStorePoisoned;
    reply.value = e.what();
  }
  return reply;
}

}  // namespace

void TcpStoreServer::Serve(int fd) {
  try {
    const internal::StoreHelloVerdict verdict =
        internal::CheckStoreHello(ReadStoreHello(fd), identity_);
    if (!verdict.reason.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++rejected_;
      }
      ReplyToHello(fd, false, verdict.reason);
      if (verdict.poison) store_.Poison(verdict.reason);
      throw Error(ErrorKind::kProtocol, "hello refused");
    }
    ReplyToHello(fd, true, "");
    for (;;) {
      uint32_t len = 0;
      if (!internal::ReadFull(fd, &len, 4, Deadline::Never(), "store request")) break;
      if (len > kMaxStoreMessage) throw Error(ErrorKind::kProtocol, "request too long");
      std::string body(len, '\0');
      internal::ReadFull(fd, body.data(), len, Deadline::After(std::chrono::seconds(60)),
                         "store request");
      const std::string out =
          internal::SerializeStoreReply(Execute(store_, internal::ParseStoreRequest(body)));
      internal::WriteFull(fd, out.data(), out.size(), Deadline::After(std::chrono::seconds(60)),
                          "store reply");
    }
  } catch (const Error&) {
    // A broken or rejected client: drop it, keep serving the others.
  } catch (const std::exception&) {
  }
  std::lock_guard<std::mutex> lock(mu_);
  client_fds_.erase(std::remove(client_fds_.begin(), client_fds_.end(), fd), client_fds_.end());
  ::close(fd);
}

// ---------------------------------------------------------------------------------------------
// TcpStore (client)

TcpStore::TcpStore(const std::string& host, int port, const JobIdentity& identity, int rank,
                   Deadline deadline, std::chrono::milliseconds op_timeout)
    : where_(StrCat("store at ", host, ":", port)), op_timeout_(op_timeout) {
  // Retry until the server accepts the hello: rank 0 may not be listening yet.
  Fd fd = internal::ConnectTcpRetry(host, port, deadline, StrCat("rank ", rank, ": ", where_));
  internal::SetNoDelay(fd.get());
  ByteWriter w;
  w.U32(kStoreMagic);
  w.U16(kStoreVersion);
  w.U64(identity.TokenDigest());
  w.U32(static_cast<uint32_t>(identity.world_size));
  w.U64(identity.fingerprint);
  w.U32(static_cast<uint32_t>(rank));
  // Errors name the address: a port held by some other program accepts the connection and
  // never answers, and only the deadline tells.
  const std::string hello = StrCat("rank ", rank, ": hello to the ", where_);
  internal::WriteFull(fd.get(), w.bytes().data(), w.bytes().size(), deadline, hello.c_str());
  uint8_t status = 0;
  if (!internal::ReadFull(fd.get(), &status, 1, deadline, hello.c_str())) {
    Fail(ErrorKind::kPeerFailure, where_, " closed the connection during the hello");
  }
  uint32_t len = 0;
  internal::ReadFull(fd.get(), &len, 4, deadline, hello.c_str());
  if (len > 64 * 1024) {
    Fail(ErrorKind::kProtocol, where_,
         ": hello reply too long (is another program listening "
         "on that port?)");
  }
  std::string reason(len, '\0');
  internal::ReadFull(fd.get(), reason.data(), len, deadline, hello.c_str());
  if (status != 0) {
    throw Error(ErrorKind::kRejected, StrCat(where_, " rejected rank ", rank, ": ", reason), 0);
  }
  fd_ = fd.Release();
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::Call(uint8_t command, const std::vector<std::string>& args, int64_t number,
                           Deadline deadline, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& a : args) {
    if (a.size() > kMaxStoreMessage / 2) {
      Fail(ErrorKind::kInvalidArgument, what, ": value too large");
    }
  }
  const std::string out = internal::SerializeStoreRequest({command, args, number});
  if (out.size() - 4 > kMaxStoreMessage) {
    Fail(ErrorKind::kInvalidArgument, what, ": request too large");
  }
  // The server answers a wait by its own deadline; allow a margin for the reply to travel.
  Deadline io =
      deadline.IsNever() ? Deadline::Never() : Deadline(deadline.at() + std::chrono::seconds(5));
  std::string context = StrCat(what, " (", where_, ")");
  internal::WriteFull(fd_, out.data(), out.size(), io, context.c_str());
  uint32_t len = 0;
  if (!internal::ReadFull(fd_, &len, 4, io, context.c_str())) {
    throw Error(ErrorKind::kPeerFailure,
                StrCat(context, ": the store closed the connection (rank 0 exited?)"), 0);
  }
  if (len > kMaxStoreMessage + 64) Fail(ErrorKind::kProtocol, context, ": reply too long");
  std::string body(len, '\0');
  internal::ReadFull(fd_, body.data(), len, io, context.c_str());
  const internal::StoreReply reply = internal::ParseStoreReply(body, context.c_str());
  if (reply.status == kStoreTimedOut) {
    throw Error(ErrorKind::kTimeout, StrCat(what, ": ", reply.value));
  }
  if (reply.status == kStorePoisoned) {
    throw Error(ErrorKind::kRejected, StrCat(what, ": ", reply.value));
  }
  if (command == kAdd || command == kCheck) return std::to_string(reply.number);
  return reply.value;
}

namespace {
int64_t TimeoutMs(Deadline d) { return d.IsNever() ? -1 : static_cast<int64_t>(d.RemainingMs()); }
}  // namespace

void TcpStore::Set(const std::string& key, const std::string& value) {
  if (key.size() > kMaxStoreKey) Fail(ErrorKind::kInvalidArgument, "store key too long");
  Call(kSet, {key, value}, 0, Deadline::After(op_timeout_), "store set '" + key + "'");
}

std::string TcpStore::Get(const std::string& key, Deadline deadline) {
  return Call(kGet, {key}, TimeoutMs(deadline), deadline, "store get '" + key + "'");
}

void TcpStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  Call(kWait, keys, TimeoutMs(deadline), deadline, "store wait");
}

int64_t TcpStore::Add(const std::string& key, int64_t delta) {
  return std::stoll(
      Call(kAdd, {key}, delta, Deadline::After(op_timeout_), "store add '" + key + "'"));
}

bool TcpStore::Check(const std::vector<std::string>& keys) {
  return Call(kCheck, keys, 0, Deadline::After(op_timeout_), "store check") == "1";
}

}  // namespace cortado::dist
