// Errors: every recoverable failure is a cortado::Error carrying its context (which layer, which
// config key with line:column, which file). Library code throws; tools/ catches at the top,
// prints one line and returns non-zero. Broken internal invariants use CORTADO_ASSERT.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace cortado {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Concatenates any streamable values into one string: StrCat("layer '", name, "': ", n).
template <typename... Args>
std::string StrCat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <typename... Args>
[[noreturn]] void Fail(Args&&... args) {
  throw Error(StrCat(std::forward<Args>(args)...));
}

}  // namespace cortado

// Throws cortado::Error with the message when cond is false.
#define CORTADO_CHECK(cond, ...)               \
  do {                                         \
    if (!(cond)) ::cortado::Fail(__VA_ARGS__); \
  } while (0)

// An internal invariant: failing it is a bug in Cortado, reported with file:line.
#define CORTADO_ASSERT(cond)                                                      \
  do {                                                                            \
    if (!(cond))                                                                  \
      ::cortado::Fail("internal error at ", __FILE__, ":", __LINE__, ": ", #cond, \
                      " (please report this)");                                   \
  } while (0)
