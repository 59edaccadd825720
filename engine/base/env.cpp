#include "engine/base/env.h"

#include <cstdlib>
#include <string_view>

#include "engine/base/error.h"
#include "engine/base/numbers.h"

namespace cortado {

std::optional<std::string> EnvString(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

namespace {

// The variable parsed by `parse` and within [min, max], or fallback when it is unset or empty;
// anything else throws naming the variable, its value and `what` ("an integer").
template <typename T>
T EnvNumber(const char* name, T fallback, T min, T max, bool (*parse)(std::string_view, T*),
            const char* what) {
  const auto text = EnvString(name);
  if (!text) return fallback;
  T v = 0;
  CORTADO_CHECK(parse(*text, &v) && v >= min && v <= max, name, "='", *text, "': must be ", what,
                " from ", min, " to ", max);
  return v;
}

}  // namespace

int64_t EnvInt(const char* name, int64_t fallback, int64_t min, int64_t max) {
  return EnvNumber<int64_t>(name, fallback, min, max, ParseInt64, "an integer");
}

double EnvDouble(const char* name, double fallback, double min, double max) {
  return EnvNumber<double>(name, fallback, min, max, ParseFiniteDouble, "a number");
}

std::string EnvChoice(const char* name, const std::string& fallback,
                      std::initializer_list<const char*> choices) {
  const auto text = EnvString(name);
  if (!text) return fallback;
  std::string known;
  for (const char* c : choices) {
    if (*text == c) return *text;
    known += (known.empty() ? "" : ", ") + std::string(c);
  }
  Fail(name, "='", *text, "': must be one of ", known);
}

}  // namespace cortado
