#include "engine/base/closest_name.h"

#include <algorithm>

namespace cortado {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string ClosestName(const std::string& name, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 0;
  for (const std::string& k : known) {
    const size_t d = EditDistance(name, k);
    // Close enough to suggest: two edits, or the start of the name (`warmup` of warmup_iters).
    // A prefix is ranked by its distance too, so `code` finds codec before codec_candidates.
    const bool close = d <= 2 || (name.size() >= 2 && k.rfind(name, 0) == 0);
    if (close && (best.empty() || d < best_d)) {
      best = k;
      best_d = d;
    }
  }
  return best;
}

}  // namespace cortado
