// "Did you mean": the known name closest to a misspelled one (a command, an option, a config
// key), by edit distance.
#pragma once

#include <string>
#include <vector>

namespace cortado {

// Levenshtein distance between two strings.
size_t EditDistance(const std::string& a, const std::string& b);

// The entry of `known` nearest to `name`: a known name that `name` begins (at least two
// characters), or one within two edits; "" when none is that close.
std::string ClosestName(const std::string& name, const std::vector<std::string>& known);

}  // namespace cortado
