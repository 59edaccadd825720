#include "engine/base/numbers.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

namespace cortado {

bool ParseInt64(std::string_view text, int64_t* out) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return false;
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) return false;
  *out = v;
  return true;
}

bool ParseFiniteDouble(std::string_view text, double* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return false;
  const std::string s(text);  // strtod needs the terminating zero
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace cortado
