// Internal: one connection of the TCP mesh while it is being set up, as a small state machine
// (the model is Gloo's transport/tcp/pair: one short method per state). A rank dials every lower
// rank and accepts every higher one:
//   dialed:   kConnecting --socket writable, hello sent--> kAwaitingAck --hello-ack--> established
//   accepted: kAwaitingHello --hello passes HelloRejection, ack sent--> established
// TcpTransport::Connect polls every pending handshake in one loop and calls OnReady when poll()
// reports its socket; the state's handler says what to do with the connection next (Step).
// A dialed peer is a rank of this job: a refusal or garbled answer from it fails Connect. An
// inbound connection may be anyone: whatever is wrong with it gets a reject frame and is
// dropped, so a stranger cannot hold up the mesh.
#pragma once

#include <poll.h>

#include <functional>
#include <string>

#include "common/socket.h"
#include "cortado/dist/deadline.h"
#include "transport/tcp/wire.h"

namespace cortado::dist::tcp {

// What the mesh does with a handshake after its handler ran.
enum class Step {
  kEstablished,  // admitted: the socket (TakeFd) is the connection with peer()
  kRetry,        // keep it and poll again: more bytes are due, or a failed dial waits to redial
  kDrop,         // forget it: an inbound connection refused, closed early, or never heard from
};

// What every handshake of one mesh checks and sends.
struct HandshakeContext {
  int rank = 0;
  int size = 0;
  internal::HelloPayload mine{};          // this rank's hello; to_rank is set per dial
  Deadline deadline = Deadline::Never();  // bounds writing a hello or an ack
  std::function<bool(int)> connected;     // whether a rank already has its connection
};

class Handshake {
 public:
  enum class State { kConnecting, kAwaitingAck, kAwaitingHello };

  // Dials `peer`, a lower rank, at its listening `address` (kConnecting). A dial refused at once
  // is retried after a pause. Throws kProtocol for a malformed or non-IPv4 address.
  static Handshake Dial(int peer, const std::string& address);
  // A connection the listener accepted (kAwaitingHello); dropped if silent for 10 s.
  static Handshake Accept(internal::Fd fd);

  // The socket and the events to poll it for; false while a failed dial waits for its redial
  // (which this call makes once it is due).
  bool PollFor(pollfd* p);
  // The current state's handler; call when poll() reported the socket.
  Step OnReady(const HandshakeContext& context);
  // An accepted connection that has not said hello in time.
  bool Expired() const { return state_ == State::kAwaitingHello && expires_.Expired(); }

  State state() const { return state_; }
  bool inbound() const { return inbound_; }
  // The dialed rank; for an accepted connection, the rank its hello named once established.
  int peer() const { return peer_; }
  internal::Fd TakeFd() { return std::move(fd_); }

 private:
  Handshake(State state, bool inbound) : state_(state), inbound_(inbound) {}

  Step OnConnecting(const HandshakeContext& context);
  Step OnAwaitingAck(const HandshakeContext& context);
  Step OnAwaitingHello(const HandshakeContext& context);
  // Closes the socket and dials again after a pause (kConnecting).
  Step Redial();
  // Reads what the peer sent so far into in_, never past the handshake frame; false on EOF.
  bool ReadFrame();

  State state_;
  bool inbound_;
  int peer_ = -1;
  std::string address_;  // dialed: the peer's listening address
  internal::Fd fd_;
  std::string in_;  // handshake bytes received so far
  Deadline expires_ = Deadline::Never();
  Clock::time_point redial_at_{};
};

}  // namespace cortado::dist::tcp
