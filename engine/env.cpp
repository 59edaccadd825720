#include "engine/env.h"

#include <cstdlib>

#include "engine/error.h"
#include "engine/numbers.h"

namespace cortado {

std::optional<std::string> EnvString(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int64_t EnvInt(const char* name, int64_t fallback, int64_t min, int64_t max) {
  const auto text = EnvString(name);
  if (!text) return fallback;
  int64_t v = 0;
  CORTADO_CHECK(ParseInt64(*text, &v) && v >= min && v <= max, name, "='", *text,
                "': must be an integer from ", min, " to ", max);
  return v;
}

double EnvDouble(const char* name, double fallback, double min, double max) {
  const auto text = EnvString(name);
  if (!text) return fallback;
  double v = 0;
  CORTADO_CHECK(ParseFiniteDouble(*text, &v) && v >= min && v <= max, name, "='", *text,
                "': must be a number from ", min, " to ", max);
  return v;
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
