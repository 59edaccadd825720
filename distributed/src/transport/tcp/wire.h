// Internal: the frame format of the TCP transport. Every message on a data connection is a
// 24-byte header followed by `length` payload bytes:
//   u32 magic "CTDF" | u16 version | u16 type | u64 tag | u64 length
// The header is checked (magic, version, type, and length against what the receiver posted or a
// fixed cap) before a single payload byte is read or any memory is allocated for it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cortado::dist::internal {

constexpr uint32_t kFrameMagic = 0x46445443;  // "CTDF" in little-endian byte order
constexpr uint16_t kFrameVersion = 1;

enum FrameType : uint16_t {
  kFrameData = 1,         // a tagged message; payload goes to the matching posted receive
  kFrameHello = 2,        // first frame of a connection: who I am, which job (see HelloPayload)
  kFrameHelloAck = 3,     // the acceptor agrees
  kFrameReject = 4,       // the acceptor refuses; payload: reason text
  kFrameAbort = 5,        // the sender gives up; payload: i32 root rank, u64 its operation,
                          //   str reason
  kFrameGoodbye = 6,      // the sender closes cleanly; a following EOF is not a failure
  kFrameStatusReq = 7,    // "how far are you?" (tag: the asker's operation number)
  kFrameStatusReply = 8,  // payload: u64 operations started, u64 operations finished
};

struct FrameHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint64_t tag;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 24, "frame header is 24 bytes on the wire");

inline FrameHeader MakeHeader(FrameType type, uint64_t tag, uint64_t length) {
  return FrameHeader{kFrameMagic, kFrameVersion, static_cast<uint16_t>(type), tag, length};
}

// kFrameHello payload.
struct HelloPayload {
  uint32_t from_rank;
  uint32_t to_rank;
  uint32_t world_size;
  uint32_t reserved;
  uint64_t token_digest;
  uint64_t fingerprint;
};
static_assert(sizeof(HelloPayload) == 32, "hello payload is 32 bytes on the wire");

constexpr size_t kMaxControlPayload = 64 << 10;
// A data frame that arrives before its receive is posted ("unexpected") is buffered when it is
// at most this long. A longer one waits in the socket until its receive is posted
// (back-pressure, like MPI's rendezvous protocol): it costs no copy and no allocation, and a
// peer cannot make us allocate at will. Receives for a connection should therefore be posted in
// the order the peer sends, which every collective here does.
constexpr size_t kMaxBufferedFrame = 64 << 10;
// Buffered unexpected bytes per connection before reading pauses.
constexpr size_t kMaxUnexpectedBytes = 64 << 20;
// When the peer has closed its side, any frame up to this size is buffered so the close is
// seen; a longer unmatched frame then fails the connection.
constexpr size_t kMaxUnexpectedFrame = 256 << 20;

}  // namespace cortado::dist::internal
