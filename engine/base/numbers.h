// Number parsing for everything the engine and the tools read from text (YAML values, layer
// settings, checkpoint metadata, environment variables): the whole string must be the number,
// so "8x", "", " 8" and "1e999" are refused, never read as a prefix, zero or infinity.
#pragma once

#include <cstdint>
#include <string_view>

namespace cortado {

// A decimal integer with an optional sign; false on anything else or when out of range.
bool ParseInt64(std::string_view text, int64_t* out);
// A finite decimal or scientific number (no inf, no nan); false on anything else.
bool ParseFiniteDouble(std::string_view text, double* out);

}  // namespace cortado
