// The comma-separated numbers a flag takes ("1,15,27", "0,0.5,1"): token ids, prompt lengths,
// needle depths. Non-obvious: every part must parse whole (strtoll/strtod-style prefixes such
// as "12abc" are refused), and the message shows the flag's own example.
#pragma once
#include <sstream>
#include <string>
#include <vector>

#include "longtrain/core/check.h"

namespace lt {

template <class T>
std::vector<T> parseNumberList(const std::string& text, const std::string& flag, const std::string& example) {
  std::vector<T> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    std::istringstream in(part);
    T v{};
    in >> v;
    LT_CHECK(!part.empty() && in && in.peek() == EOF, flag, " '", text, "': '", part, "' is not a number (give a ",
             "comma-separated list, e.g. ", flag, " ", example, ")");
    out.push_back(v);
  }
  LT_CHECK(!out.empty(), flag, " is empty; give a comma-separated list, e.g. ", flag, " ", example);
  return out;
}

}  // namespace lt
