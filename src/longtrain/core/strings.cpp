// Edit distance by the two-row dynamic program; inputs here are short names. Byte sizes
// accept both binary and decimal units, since users write both.
#include "longtrain/core/strings.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "longtrain/core/check.h"

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
  // Only a near miss or a cut-short name: a real key of another meaning is not offered for a
  // misspelling.
  const bool prefix = name.size() >= 4 && best.rfind(name, 0) == 0;
  return bestD <= std::max<size_t>(2, name.size() / 4) || prefix ? best : std::string();
}

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

namespace {
constexpr double kMiBytes = 1024.0 * 1024.0;
}  // namespace

int64_t parseByteSize(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    LT_CHECK(false, what, ": cannot read '", text, "' as a byte budget (", why,
             "); expected a number with an optional unit, e.g. 4GiB, 512MiB, 1.5GB or 1000000");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) bad("no number");
  const std::string num = text.substr(0, i);
  if (std::count(num.begin(), num.end(), '.') > 1) bad("malformed number");
  char* end = nullptr;
  double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size()) bad("malformed number");
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double mult = 0;
  const std::pair<const char*, double> units[] = {
      {"", 1},          {"b", 1},          {"k", 1024.0},       {"kib", 1024.0},     {"kb", 1e3},
      {"m", kMiBytes},      {"mib", kMiBytes},     {"mb", 1e6},         {"g", kMiBytes * 1024},  {"gib", kMiBytes * 1024},
      {"gb", 1e9},      {"t", kMiBytes * kMiBytes}, {"tib", kMiBytes * kMiBytes}, {"tb", 1e12}};
  for (const auto& [name, m] : units)
    if (unit == name) mult = m;
  if (mult == 0) bad("unknown unit '" + text.substr(i) + "'");
  const double bytes = v * mult;
  if (!(bytes >= 1)) bad("not a positive size");
  if (bytes > 9.0e18) bad("too large");
  return static_cast<int64_t>(bytes);
}

double parseLinkRate(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    LT_CHECK(false, what, ": cannot read '", text, "' as a link rate (", why,
             "); expected bits, e.g. 10Gbit/s, 1gbit or 100Mbit, or bytes a second, e.g. 1.25GB/s or 100MiB/s");
  };
  std::string lower = text;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const bool perSecond = lower.size() > 2 && lower.compare(lower.size() - 2, 2, "/s") == 0;
  const std::string body = perSecond ? text.substr(0, text.size() - 2) : text;
  std::string unit = perSecond ? lower.substr(0, lower.size() - 2) : lower;
  if (unit.size() >= 3 && unit.compare(unit.size() - 3, 3, "bit") == 0) {
    size_t i = 0;
    while (i < unit.size() && (std::isdigit(static_cast<unsigned char>(unit[i])) || unit[i] == '.')) ++i;
    const std::string num = unit.substr(0, i), prefix = unit.substr(i, unit.size() - 3 - i);
    const std::pair<const char*, double> prefixes[] = {{"", 1}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"t", 1e12}};
    double mult = 0;
    for (const auto& [name, m] : prefixes)
      if (prefix == name) mult = m;
    if (num.empty() || std::count(num.begin(), num.end(), '.') > 1) bad("no number");
    if (mult == 0) bad("unknown unit '" + text.substr(i) + "'");
    const double bits = std::strtod(num.c_str(), nullptr) * mult;
    if (!(bits >= 8)) bad("not a positive rate");
    return bits / 8;
  }
  if (!perSecond) bad("a rate in bytes needs '/s'");
  return static_cast<double>(parseByteSize(body, what));
}

}  // namespace lt
