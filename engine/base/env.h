// Environment variables of the engine and the tools, read one way: unset or empty means the
// default, anything else must be a valid value, or the call throws one line naming the
// variable, what it holds and what it takes (the communication library has the same rules for
// its own variables, distributed/include/cortado/dist/env.h).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace cortado {

// The value, or nullopt when the variable is unset or empty.
std::optional<std::string> EnvString(const char* name);
// An integer in [min, max], or fallback when unset.
int64_t EnvInt(const char* name, int64_t fallback, int64_t min, int64_t max);
// A finite number in [min, max], or fallback when unset.
double EnvDouble(const char* name, double fallback, double min, double max);
// One of `choices`, or fallback when unset.
std::string EnvChoice(const char* name, const std::string& fallback,
                      std::initializer_list<const char*> choices);

}  // namespace cortado
