// Edit distance by the two-row dynamic program; inputs here are short names. Byte sizes
// accept both binary and decimal units, since users write both.
#include "longtrain/core/strings.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <initializer_list>

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

// The digits and points `s` starts with, as a number; -1 when they do not read as one (two
// points, a lone point) or there are none. *end: where they stop.
double leadingNumber(const std::string& s, size_t* end) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  *end = i;
  const std::string num = s.substr(0, i);
  char* stop = nullptr;
  const double v = std::strtod(num.c_str(), &stop);
  if (i == 0 || std::count(num.begin(), num.end(), '.') > 1 || stop != num.c_str() + num.size()) return -1;
  return v;
}

// `unit` in `table` (exact match), or 0.
double multiplierOf(const std::string& unit, std::initializer_list<std::pair<const char*, double>> table) {
  for (const auto& [name, m] : table)
    if (unit == name) return m;
  return 0;
}

}  // namespace

int64_t parseByteSize(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    LT_CHECK(false, what, ": cannot read '", text, "' as a byte budget (", why,
             "); expected a number with an optional unit, e.g. 4GiB, 512MiB, 1.5GB or 1000000");
  };
  size_t i = 0;
  const double v = leadingNumber(text, &i);
  if (i == 0) bad("no number");
  if (v < 0) bad("malformed number");
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const double mult = multiplierOf(
      unit, {{"", 1},          {"b", 1},          {"k", 1024.0},       {"kib", 1024.0},     {"kb", 1e3},
             {"m", kMiBytes},  {"mib", kMiBytes}, {"mb", 1e6},         {"g", kMiBytes * 1024},  {"gib", kMiBytes * 1024},
             {"gb", 1e9},      {"t", kMiBytes * kMiBytes}, {"tib", kMiBytes * kMiBytes}, {"tb", 1e12}});
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
  const bool perSecond = text.size() > 2 && text.compare(text.size() - 2, 2, "/s") == 0;
  const std::string body = perSecond ? text.substr(0, text.size() - 2) : text;
  size_t at = 0;
  const double v = leadingNumber(body, &at);
  if (v < 0) bad("no number");
  std::string unit = body.substr(at), lower = unit;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower.size() >= 3 && lower.compare(lower.size() - 3, 3, "bit") == 0) {
    const double m = multiplierOf(lower, {{"bit", 1}, {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}, {"tbit", 1e12}});
    if (m == 0) bad("unknown unit '" + unit + "'");
    if (!(v * m >= 8)) bad("less than a byte a second");
    return v * m / 8;
  }
  if (!perSecond) bad("a rate in bytes needs '/s'");
  if (!unit.empty() && unit.back() == 'b') bad("'b' could be bits or bytes: write Gbit/s for bits, GB/s for bytes");
  const double m = multiplierOf(unit, {{"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024.0},
                                       {"MiB", kMiBytes}, {"GiB", kMiBytes * 1024}});
  if (m == 0) bad("unknown unit '" + unit + "/s'");
  if (!(v * m >= 1)) bad("not a positive rate");
  return v * m;
}

}  // namespace lt
