// Internal: parsing and checking the TCP transport's frames (wire.h) apart from the sockets, so
// the checks that stand between a peer's bytes and memory can be tested and fuzzed on their own
// (tests/fuzz, target "frames").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/tcp/wire.h"

namespace cortado::dist::internal {

// "data", "hello", ..., "unknown(N)".
std::string FrameTypeName(uint16_t type);

// A complete handshake frame at the front of `in`: true and *h, *payload set; false when more
// bytes are needed. Throws kProtocol on garbage (bad magic as soon as 4 bytes show it, another
// protocol version, a payload over kMaxControlPayload).
bool ParseHandshakeFrame(const std::string& in, FrameHeader* h, std::string* payload);

// Why an inbound hello must be refused, or "" to accept it. `mine` holds this rank's token
// digest and fingerprint; `connected`: the dialing rank already has a connection.
std::string HelloRejection(const HelloPayload& hello, const HelloPayload& mine, int rank, int size,
                           bool connected);

// Why a frame header on an open connection is malformed, or "": magic, version, and for control
// frames (abort, goodbye, status) the kMaxControlPayload limit. Data frames are checked against
// the posted receive by the caller; handshake frames on an open connection are refused there.
std::string FrameHeaderProblem(const FrameHeader& h);

struct AbortPayload {
  int32_t root = 0;  // the rank that failed first, as the sender knows it
  uint64_t seq = 0;  // the sender's operation number
  std::string reason;
};
struct StatusPayload {
  uint64_t ops_started = 0;
  uint64_t ops_finished = 0;
};
// Control payloads; throw kProtocol when short or malformed.
AbortPayload ParseAbortPayload(const char* data, size_t len);
StatusPayload ParseStatusPayload(const char* data, size_t len);

}  // namespace cortado::dist::internal
