// The transport's frame checks and the store's message parsers, apart from the sockets
// (src/transport/tcp/frames.h, src/bootstrap/store_wire.h). tests/fuzz runs the same functions
// on mutated inputs.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>

#include "../src/bootstrap/store_wire.h"
#include "../src/common/socket.h"
#include "../src/transport/tcp/frames.h"
#include "cortado/dist/error.h"

namespace cortado::dist::internal {
namespace {

std::string Frame(FrameType type, uint64_t tag, const std::string& payload) {
  FrameHeader h = MakeHeader(type, tag, payload.size());
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + payload;
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Frames, HandshakeFramesAreParsedWholeAndGarbageIsRefusedEarly) {
  FrameHeader h;
  std::string payload;
  const std::string hello = Frame(kFrameHello, 0, std::string(sizeof(HelloPayload), '\0'));
  EXPECT_FALSE(ParseHandshakeFrame(hello.substr(0, 30), &h, &payload));  // more bytes needed
  ASSERT_TRUE(ParseHandshakeFrame(hello + "next frame", &h, &payload));
  EXPECT_EQ(h.type, kFrameHello);
  EXPECT_EQ(payload.size(), sizeof(HelloPayload));
  EXPECT_NE(ErrorOf([&] { ParseHandshakeFrame("GET /", &h, &payload); }).find("bad magic"),
            std::string::npos);
  FrameHeader v2 = MakeHeader(kFrameHello, 0, 0);
  v2.version = 2;
  EXPECT_NE(ErrorOf([&] {
              ParseHandshakeFrame(std::string(reinterpret_cast<char*>(&v2), sizeof(v2)), &h,
                                  &payload);
            }).find("protocol version 2"),
            std::string::npos);
  FrameHeader huge = MakeHeader(kFrameHello, 0, kMaxControlPayload + 1);
  EXPECT_NE(ErrorOf([&] {
              ParseHandshakeFrame(std::string(reinterpret_cast<char*>(&huge), sizeof(huge)), &h,
                                  &payload);
            }).find("too long"),
            std::string::npos);
}

TEST(Frames, HellosFromAnotherJobRankOrWorldAreRefusedWithTheReason) {
  HelloPayload mine{};
  mine.token_digest = 11;
  mine.fingerprint = 22;
  HelloPayload ok{};
  ok.from_rank = 2;
  ok.to_rank = 1;
  ok.world_size = 3;
  ok.token_digest = 11;
  ok.fingerprint = 22;
  EXPECT_EQ(HelloRejection(ok, mine, 1, 3, false), "");
  EXPECT_NE(HelloRejection(ok, mine, 1, 3, true).find("duplicate connection from rank 2"),
            std::string::npos);
  HelloPayload h = ok;
  h.token_digest = 12;
  EXPECT_NE(HelloRejection(h, mine, 1, 3, false).find("job token mismatch"), std::string::npos);
  h = ok;
  h.world_size = 4;
  EXPECT_NE(HelloRejection(h, mine, 1, 3, false).find("world size mismatch: rank 2 says 4"),
            std::string::npos);
  h = ok;
  h.fingerprint = 23;
  EXPECT_NE(HelloRejection(h, mine, 1, 3, false).find("fingerprint mismatch"), std::string::npos);
  h = ok;
  h.to_rank = 0;
  EXPECT_NE(HelloRejection(h, mine, 1, 3, false).find("this is rank 1, not rank 0"),
            std::string::npos);
  for (uint32_t from : {0u, 1u, 3u, 0xffffffffu}) {  // lower ranks dial no one; outside the world
    h = ok;
    h.from_rank = from;
    EXPECT_NE(HelloRejection(h, mine, 1, 3, false).find("must not dial rank 1"), std::string::npos)
        << from;
  }
}

TEST(Frames, HeadersOnAnOpenConnectionAreCheckedBeforeThePayload) {
  EXPECT_EQ(FrameHeaderProblem(MakeHeader(kFrameData, 5, uint64_t{1} << 40)), "");  // vs recv
  EXPECT_EQ(FrameHeaderProblem(MakeHeader(kFrameAbort, 0, kMaxControlPayload)), "");
  EXPECT_NE(FrameHeaderProblem(MakeHeader(kFrameStatusReply, 0, kMaxControlPayload + 1))
                .find("status-reply frame of"),
            std::string::npos);
  EXPECT_NE(FrameHeaderProblem(MakeHeader(kFrameHello, 0, 32)).find("unexpected hello frame"),
            std::string::npos);
  EXPECT_NE(FrameHeaderProblem(MakeHeader(static_cast<FrameType>(99), 0, 0)).find("unknown(99)"),
            std::string::npos);
  FrameHeader bad = MakeHeader(kFrameData, 0, 0);
  bad.magic = 0;
  EXPECT_NE(FrameHeaderProblem(bad).find("malformed frame"), std::string::npos);
}

TEST(Frames, ControlPayloadsParseAndShortOnesAreRefused) {
  ByteWriter w;
  w.U32(2);
  w.U64(7);
  w.Str("killed");
  const AbortPayload a = ParseAbortPayload(w.bytes().data(), w.bytes().size());
  EXPECT_EQ(a.root, 2);
  EXPECT_EQ(a.seq, 7u);
  EXPECT_EQ(a.reason, "killed");
  EXPECT_NE(ErrorOf([&] { ParseAbortPayload(w.bytes().data(), 13); }).find("abort frame"),
            std::string::npos);
  ByteWriter s;
  s.U64(9);
  s.U64(8);
  EXPECT_EQ(ParseStatusPayload(s.bytes().data(), 16).ops_finished, 8u);
  EXPECT_NE(ErrorOf([&] { ParseStatusPayload(s.bytes().data(), 15); }).find("too short"),
            std::string::npos);
}

TEST(StoreWire, HelloVerdictsTellStrangersFromMembersThatPoisonTheJob) {
  const JobIdentity id{"job", 3, 0x5678};
  StoreHello h;
  h.magic = kStoreMagic;
  h.version = kStoreVersion;
  h.token_digest = id.TokenDigest();
  h.world_size = 3;
  h.fingerprint = 0x5678;
  h.rank = 2;
  EXPECT_EQ(CheckStoreHello(h, id).reason, "");
  auto verdict = [&](auto change) {
    StoreHello x = h;
    change(x);
    return CheckStoreHello(x, id);
  };
  auto v = verdict([](StoreHello& x) { x.magic = 0x20544547; });  // "GET "
  EXPECT_NE(v.reason.find("not a Cortado store client"), std::string::npos);
  EXPECT_FALSE(v.poison);
  v = verdict([](StoreHello& x) { x.version = 9; });
  EXPECT_NE(v.reason.find("version 9"), std::string::npos);
  EXPECT_FALSE(v.poison);
  v = verdict([](StoreHello& x) { x.token_digest ^= 1; });
  EXPECT_NE(v.reason.find("job token mismatch"), std::string::npos);
  EXPECT_FALSE(v.poison);
  v = verdict([](StoreHello& x) { x.world_size = 4; });
  EXPECT_NE(v.reason.find("world size mismatch: rank 2 says 4"), std::string::npos);
  EXPECT_TRUE(v.poison);
  v = verdict([](StoreHello& x) { x.fingerprint = 1; });
  EXPECT_NE(v.reason.find("fingerprint mismatch"), std::string::npos);
  EXPECT_TRUE(v.poison);
  v = verdict([](StoreHello& x) { x.rank = 3; });
  EXPECT_NE(v.reason.find("rank 3 is outside the world of 3"), std::string::npos);
  EXPECT_TRUE(v.poison);
  EXPECT_NE(ErrorOf([] { ParseStoreHello("CDST", 4); }).find("store hello"), std::string::npos);
}

TEST(StoreWire, RequestsRoundTripAndLyingCountsOrLengthsAreRefused) {
  const StoreRequest r{kWait, {"a", "", std::string(300, 'k')}, -1};
  const std::string bytes = SerializeStoreRequest(r);
  uint32_t len = 0;
  std::memcpy(&len, bytes.data(), 4);
  EXPECT_EQ(len, bytes.size() - 4);
  const StoreRequest back = ParseStoreRequest(bytes.substr(4));
  EXPECT_EQ(back.command, kWait);
  EXPECT_EQ(back.args, r.args);
  EXPECT_EQ(back.number, -1);
  // argc claims more keys than the body could hold: refused before anything is reserved.
  std::string lie = bytes.substr(4);
  const uint32_t many = 0x40000000;
  std::memcpy(&lie[1], &many, 4);
  EXPECT_NE(ErrorOf([&] { ParseStoreRequest(lie); }).find("too many keys"), std::string::npos);
  // A key longer than the body.
  std::string longer = bytes.substr(4);
  const uint32_t big = 1000;
  std::memcpy(&longer[5], &big, 4);
  EXPECT_NE(ErrorOf([&] { ParseStoreRequest(longer); }).find("string too long"), std::string::npos);
  EXPECT_NE(
      ErrorOf([&] { ParseStoreRequest(bytes.substr(4, bytes.size() - 6)); }).find("too short"),
      std::string::npos);
  ByteWriter w;
  w.U8(kStoreTimedOut);
  w.Str("waited 5 s for 'x'");
  w.I64(0);
  EXPECT_EQ(ParseStoreReply(w.bytes(), "reply").value, "waited 5 s for 'x'");
}

}  // namespace
}  // namespace cortado::dist::internal
