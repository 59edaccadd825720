// "Did you mean": the known name closest to a misspelled one (a command, an option, a config
// key), by edit distance.
#pragma once

#include <string>
#include <vector>

namespace cortado {

// Levenshtein distance between two strings.
size_t EditDistance(const std::string& a, const std::string& b);

// The entry of `known` nearest to `name` by edit distance (the first listed of equals) among
// those close enough: within two edits, or beginning with `name` (at least two characters);
// "" when none is. A caller offers only names valid where `name` stands (YamlSection::Declare).
std::string ClosestName(const std::string& name, const std::vector<std::string>& known);

}  // namespace cortado
