// Errors of the communication library. Every failure is a cortado::dist::Error that carries its
// kind, the peer rank it concerns (or -1) and the operation that was running ("allreduce",
// "store get 'addr/3'", ...), so a trainer can print one clear line and a test can check fields.
// Recoverable problems (a dead peer, a deadline, a rejected stranger) are errors; a broken
// internal invariant is reported with file:line as kInternal.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cortado::dist {

enum class ErrorKind {
  kInvalidArgument,  // the caller passed something impossible (bad rank, mismatched sizes)
  kConfig,           // the environment or options are missing or malformed
  kTimeout,          // an operation's deadline passed (ranks() lists who did not arrive)
  kPeerFailure,      // a peer died, closed its connection or aborted (peer_rank() names it)
  kRejected,         // a handshake was refused (token, world size or fingerprint mismatch)
  kProtocol,         // bytes on a connection are not what the protocol allows
  kSystem,           // a system call failed (errno text in the message)
  kInternal,         // a bug in the library
};

const char* ErrorKindName(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what, int peer_rank = -1, std::string op = {},
        std::vector<int> ranks = {})
      : std::runtime_error(what),
        kind_(kind),
        peer_rank_(peer_rank),
        op_(std::move(op)),
        ranks_(std::move(ranks)) {}

  ErrorKind kind() const { return kind_; }
  // The rank this error is about: the dead or aborting peer, the rejected client; -1 if none.
  int peer_rank() const { return peer_rank_; }
  // The operation that failed, e.g. "allreduce"; empty outside a collective.
  const std::string& op() const { return op_; }
  // For kTimeout: the ranks that had not arrived at the operation when the deadline passed.
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  ErrorKind kind_;
  int peer_rank_;
  std::string op_;
  std::vector<int> ranks_;
};

// Concatenates streamable values: StrCat("rank ", r, " of ", n).
template <typename... Args>
std::string StrCat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <typename... Args>
[[noreturn]] void Fail(ErrorKind kind, Args&&... args) {
  throw Error(kind, StrCat(std::forward<Args>(args)...));
}

}  // namespace cortado::dist

// An internal invariant of the library; failing it is a bug, reported with file:line.
#define CORTADO_DIST_ASSERT(cond)                                                                  \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      ::cortado::dist::Fail(::cortado::dist::ErrorKind::kInternal, "internal error at ", __FILE__, \
                            ":", __LINE__, ": ", #cond, " (please report this)");                  \
  } while (0)
