// The TCP transport's mesh setup (TcpTransport::Connect): dial the lower ranks, accept the
// higher ones, every connection a Handshake (handshake.h) checked against the job identity, all
// in one poll loop, so a stranger that connects and says nothing cannot hold up the mesh.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include "common/rank_list.h"
#include "cortado/dist/error.h"
#include "transport/tcp/tcp_transport.h"

namespace cortado::dist::tcp {

void TcpTransport::Connect(const std::vector<std::string>& addresses, Deadline deadline) {
  if (static_cast<int>(addresses.size()) != size()) {
    Fail(ErrorKind::kInvalidArgument, "Connect: ", addresses.size(), " addresses for ", size(),
         " ranks");
  }
  if (connected_) Fail(ErrorKind::kInvalidArgument, "Connect called twice");
  HandshakeContext context;
  context.rank = rank();
  context.size = size();
  context.mine.from_rank = static_cast<uint32_t>(rank());
  context.mine.world_size = static_cast<uint32_t>(size());
  context.mine.token_digest = options_.identity.TokenDigest();
  context.mine.fingerprint = options_.identity.fingerprint;
  context.deadline = deadline;
  context.connected = [this](int r) { return conns_[static_cast<size_t>(r)] != nullptr; };

  std::vector<Handshake> pending;
  for (int peer = 0; peer < rank(); ++peer) {
    pending.push_back(Handshake::Dial(peer, addresses[static_cast<size_t>(peer)]));
  }
  int inbound_missing = size() - 1 - rank();
  for (;;) {
    const std::vector<int> missing = MissingPeers();
    if (missing.empty()) break;
    if (deadline.Expired()) {
      throw Error(
          ErrorKind::kTimeout,
          StrCat("rank ", rank(), ": connecting to the other ranks: no connection with rank(s) ",
                 internal::RankList(missing), " before the deadline"),
          missing.front(), "connect", missing);
    }
    PollHandshakes(context, &pending, &inbound_missing);
  }
  listen_fd_.Reset();  // the mesh is complete; later strangers are refused by the kernel
  connected_ = true;
  progress_thread_ = std::thread([this] { ProgressThreadLoop(); });
}

void TcpTransport::PollHandshakes(const HandshakeContext& context, std::vector<Handshake>* pending,
                                  int* inbound_missing) {
  std::vector<pollfd> fds;
  std::vector<int> owner;  // index in *pending per pollfd; -1: the listener
  if (*inbound_missing > 0) {
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    owner.push_back(-1);
  }
  for (size_t i = 0; i < pending->size(); ++i) {
    pollfd p;
    if ((*pending)[i].PollFor(&p)) {
      fds.push_back(p);
      owner.push_back(static_cast<int>(i));
    }
  }
  const int n = ::poll(fds.data(), fds.size(), context.deadline.RemainingMs(50));
  if (n < 0 && errno != EINTR) Fail(ErrorKind::kSystem, "poll: ", ErrnoText(errno));

  std::vector<Handshake> accepted;
  std::vector<bool> finished(pending->size(), false);
  for (size_t k = 0; k < fds.size(); ++k) {
    if (!fds[k].revents) continue;
    if (owner[k] < 0) {
      const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) accepted.push_back(Handshake::Accept(Fd(fd)));
      continue;
    }
    Handshake& h = (*pending)[static_cast<size_t>(owner[k])];
    const Step step = h.OnReady(context);
    if (step == Step::kEstablished) {
      if (h.inbound()) --*inbound_missing;
      AdoptConnection(h.peer(), h.TakeFd());
    }
    finished[static_cast<size_t>(owner[k])] = step != Step::kRetry;
  }
  // Keep what is still under way (in order), less inbound connections that never said hello.
  size_t kept = 0;
  for (size_t i = 0; i < pending->size(); ++i) {
    if (finished[i] || (*pending)[i].Expired()) continue;
    if (kept != i) (*pending)[kept] = std::move((*pending)[i]);
    ++kept;
  }
  pending->erase(pending->begin() + static_cast<std::ptrdiff_t>(kept), pending->end());
  for (Handshake& h : accepted) pending->push_back(std::move(h));
}

void TcpTransport::AdoptConnection(int peer, Fd fd) {
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
}

std::vector<int> TcpTransport::MissingPeers() const {
  std::vector<int> out;
  for (int r = 0; r < size(); ++r) {
    if (r != rank() && !conns_[static_cast<size_t>(r)]) out.push_back(r);
  }
  return out;
}

}  // namespace cortado::dist::tcp
