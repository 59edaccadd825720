#include "bootstrap/store_wire.h"

#include <cstring>

#include "common/socket.h"
#include "cortado/dist/error.h"

namespace cortado::dist::internal {

StoreHello ParseStoreHello(const char* data, size_t len) {
  ByteReader r(data, len, "store hello");
  StoreHello h;
  h.magic = r.U32();
  h.version = r.U16();
  h.token_digest = r.U64();
  h.world_size = r.U32();
  h.fingerprint = r.U64();
  h.rank = r.U32();
  return h;
}

StoreHelloVerdict CheckStoreHello(const StoreHello& h, const JobIdentity& identity) {
  if (h.magic != kStoreMagic) {
    return {StrCat("not a Cortado store client (bad magic 0x", std::hex, h.magic,
                   "); is something else using this port?"),
            false};
  }
  if (h.version != kStoreVersion) {
    return {StrCat("store protocol version ", h.version, " is not supported (server speaks ",
                   kStoreVersion, ")"),
            false};
  }
  if (h.token_digest != identity.TokenDigest()) {
    return {"job token mismatch: this store belongs to another job (check CORTADO_JOB_TOKEN)",
            false};
  }
  if (static_cast<int64_t>(h.world_size) != identity.world_size) {
    return {StrCat("world size mismatch: rank ", h.rank, " says ", h.world_size, ", rank 0 says ",
                   identity.world_size),
            true};
  }
  if (h.fingerprint != identity.fingerprint) {
    return {StrCat("fingerprint mismatch: rank ", h.rank, " has 0x", std::hex, h.fingerprint,
                   ", rank 0 has 0x", identity.fingerprint,
                   " (the ranks run different configurations)"),
            true};
  }
  if (static_cast<int64_t>(h.rank) >= identity.world_size) {
    return {StrCat("rank ", h.rank, " is outside the world of ", identity.world_size), true};
  }
  return {};
}

StoreRequest ParseStoreRequest(const std::string& body) {
  ByteReader q(body.data(), body.size(), "store request");
  StoreRequest r;
  r.command = q.U8();
  const uint32_t argc = q.U32();
  // Each argument takes at least its 4-byte length: more than the body holds is a lie.
  if (argc > q.Left() / 4) Fail(ErrorKind::kProtocol, "store request: too many keys");
  r.args.reserve(argc);
  for (uint32_t i = 0; i < argc; ++i) r.args.push_back(q.Str(kMaxStoreMessage));
  r.number = q.I64();
  return r;
}

namespace {

// A message on the wire: its u32 length, then the body.
std::string LengthPrefixed(const std::string& body) {
  ByteWriter w;
  w.U32(static_cast<uint32_t>(body.size()));
  w.Raw(body.data(), body.size());
  return w.bytes();
}

}  // namespace

std::string SerializeStoreRequest(const StoreRequest& request) {
  ByteWriter w;
  w.U8(request.command);
  w.U32(static_cast<uint32_t>(request.args.size()));
  for (const auto& a : request.args) w.Str(a);
  w.I64(request.number);
  return LengthPrefixed(w.bytes());
}

std::string SerializeStoreReply(const StoreReply& reply) {
  ByteWriter w;
  w.U8(reply.status);
  w.Str(reply.value);
  w.I64(reply.number);
  return LengthPrefixed(w.bytes());
}

StoreReply ParseStoreReply(const std::string& body, const char* context) {
  ByteReader r(body.data(), body.size(), context);
  StoreReply reply;
  reply.status = r.U8();
  reply.value = r.Str(kMaxStoreMessage);
  reply.number = r.I64();
  return reply;
}

}  // namespace cortado::dist::internal
