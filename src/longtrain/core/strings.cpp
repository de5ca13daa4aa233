// Edit distance by the two-row dynamic program; inputs here are short names.
#include "longtrain/core/strings.h"

#include <algorithm>

namespace lt {

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closestName(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t bestD = SIZE_MAX;
  for (const auto& c : candidates)
    if (size_t d = editDistance(name, c); d < bestD) bestD = d, best = c;
  return best;
}

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace lt
