#include "transport/tcp/frames.h"

#include <cstring>

#include "common/socket.h"
#include "cortado/dist/error.h"

namespace cortado::dist::internal {

std::string FrameTypeName(uint16_t type) {
  switch (type) {
    case kFrameData:
      return "data";
    case kFrameHello:
      return "hello";
    case kFrameHelloAck:
      return "hello-ack";
    case kFrameReject:
      return "reject";
    case kFrameAbort:
      return "abort";
    case kFrameGoodbye:
      return "goodbye";
    case kFrameStatusReq:
      return "status-request";
    case kFrameStatusReply:
      return "status-reply";
  }
  return StrCat("unknown(", type, ")");
}

bool ParseHandshakeFrame(const std::string& in, FrameHeader* h, std::string* payload) {
  if (in.size() < sizeof(FrameHeader)) {
    // Reject garbage as early as the magic allows.
    uint32_t magic = 0;
    if (in.size() >= 4) {
      std::memcpy(&magic, in.data(), 4);
      if (magic != kFrameMagic) Fail(ErrorKind::kProtocol, "not a Cortado peer (bad magic)");
    }
    return false;
  }
  std::memcpy(h, in.data(), sizeof(*h));
  if (h->magic != kFrameMagic) Fail(ErrorKind::kProtocol, "not a Cortado peer (bad magic)");
  if (h->version != kFrameVersion) {
    Fail(ErrorKind::kProtocol, "protocol version ", h->version, " (this build speaks ",
         kFrameVersion, ")");
  }
  if (h->length > kMaxControlPayload) {
    Fail(ErrorKind::kProtocol, "handshake frame of ", h->length, " bytes is too long");
  }
  if (in.size() < sizeof(FrameHeader) + h->length) return false;
  *payload = in.substr(sizeof(FrameHeader), h->length);
  return true;
}

std::string HelloRejection(const HelloPayload& hello, const HelloPayload& mine, int rank, int size,
                           bool connected) {
  const int64_t from = hello.from_rank;
  if (hello.token_digest != mine.token_digest) {
    return "job token mismatch: this port belongs to another job (check CORTADO_JOB_TOKEN)";
  }
  if (static_cast<int64_t>(hello.world_size) != size) {
    return StrCat("world size mismatch: rank ", from, " says ", hello.world_size, ", rank ", rank,
                  " says ", size);
  }
  if (hello.fingerprint != mine.fingerprint) {
    return StrCat("fingerprint mismatch: rank ", from, " has 0x", std::hex, hello.fingerprint,
                  ", rank ", std::dec, rank, " has 0x", std::hex, mine.fingerprint);
  }
  if (static_cast<int64_t>(hello.to_rank) != rank) {
    return StrCat("this is rank ", rank, ", not rank ", hello.to_rank);
  }
  if (from <= rank || from >= size) return StrCat("rank ", from, " must not dial rank ", rank);
  if (connected) return StrCat("duplicate connection from rank ", from);
  return "";
}

std::string FrameHeaderProblem(const FrameHeader& h) {
  if (h.magic != kFrameMagic || h.version != kFrameVersion) {
    return StrCat("sent a malformed frame (magic 0x", std::hex, h.magic, std::dec, ", version ",
                  h.version, ")");
  }
  const bool control = h.type == kFrameAbort || h.type == kFrameGoodbye ||
                       h.type == kFrameStatusReq || h.type == kFrameStatusReply;
  if (control && h.length > kMaxControlPayload) {
    return StrCat("sent a ", FrameTypeName(h.type), " frame of ", h.length, " bytes");
  }
  if (!control && h.type != kFrameData) {
    return StrCat("sent an unexpected ", FrameTypeName(h.type), " frame");
  }
  return "";
}

AbortPayload ParseAbortPayload(const char* data, size_t len) {
  ByteReader r(data, len, "abort frame");
  AbortPayload p;
  p.root = static_cast<int32_t>(r.U32());
  p.seq = r.U64();
  p.reason = r.Str(kMaxControlPayload);
  return p;
}

StatusPayload ParseStatusPayload(const char* data, size_t len) {
  ByteReader r(data, len, "status frame");
  StatusPayload p;
  p.ops_started = r.U64();
  p.ops_finished = r.U64();
  return p;
}

}  // namespace cortado::dist::internal
