// Internal: the TCP store's messages (format in store.cpp), parsed and checked apart from the
// sockets so that what stands between a client's bytes and the server can be tested and fuzzed
// on its own (tests/fuzz, target "store").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cortado/dist/env.h"

namespace cortado::dist::internal {

constexpr uint32_t kStoreMagic = 0x54534443;  // "CDST"
constexpr uint16_t kStoreVersion = 1;
constexpr size_t kStoreHelloBytes = 4 + 2 + 8 + 4 + 8 + 4;
constexpr uint32_t kMaxStoreMessage = 64u << 20;
constexpr size_t kMaxStoreKey = 4096;

enum StoreCommand : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCheck = 5 };
enum StoreStatus : uint8_t { kStoreOk = 0, kStoreTimedOut = 1, kStorePoisoned = 2 };

struct StoreHello {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint64_t token_digest = 0;
  uint32_t world_size = 0;
  uint64_t fingerprint = 0;
  uint32_t rank = 0;
};
// The first kStoreHelloBytes of `data`; throws kProtocol when there are fewer.
StoreHello ParseStoreHello(const char* data, size_t len);

// Why the server refuses a hello, or an empty reason to admit it. A refusal that poisons the
// job (a member of this job with another world size, fingerprint or an impossible rank: the
// job cannot run) sets poison; a stranger (another protocol, version or job) does not.
struct StoreHelloVerdict {
  std::string reason;
  bool poison = false;
};
StoreHelloVerdict CheckStoreHello(const StoreHello& hello, const JobIdentity& identity);

struct StoreRequest {
  uint8_t command = 0;
  std::vector<std::string> args;
  int64_t number = 0;  // a deadline in ms (< 0: none) or the delta of an add
};
// A request body (after its u32 length); throws kProtocol when malformed or oversized.
StoreRequest ParseStoreRequest(const std::string& body);
std::string SerializeStoreRequest(const StoreRequest& request);  // with its u32 length

struct StoreReply {
  uint8_t status = kStoreOk;
  std::string value;
  int64_t number = 0;
};
StoreReply ParseStoreReply(const std::string& body, const char* context);
std::string SerializeStoreReply(const StoreReply& reply);  // with its u32 length

}  // namespace cortado::dist::internal
