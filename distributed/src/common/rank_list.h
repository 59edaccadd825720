// Internal: ranks as error messages list them.
#pragma once

#include <string>
#include <vector>

namespace cortado::dist::internal {

// "0, 2, 5".
inline std::string RankList(const std::vector<int>& ranks) {
  std::string list;
  for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
  return list;
}

}  // namespace cortado::dist::internal
