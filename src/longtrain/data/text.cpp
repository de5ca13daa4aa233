// Text helpers of the commands (see text.h).
#include "longtrain/data/text.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "longtrain/core/check.h"

namespace lt::data {

std::string unescapeSeparator(const std::string& s, const std::string& flag) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    LT_CHECK(i + 1 < s.size(), flag, " '", s, "' ends in a lone backslash; escapes are \\n, \\t, \\r and \\\\");
    const char c = s[++i];
    LT_CHECK(c == 'n' || c == 't' || c == 'r' || c == '\\', flag, " '", s, "': '\\", c,
             "' is not an escape; use \\n, \\t, \\r or \\\\");
    out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : '\\';
  }
  return out;
}

TextStream::TextStream(const Tokenizer& tok, std::vector<int64_t> prompt) : tok_(tok), ids_(std::move(prompt)) {
  shown_ = tok_.decode(ids_);
  std::fputs(shown_.c_str(), stdout);
}

void TextStream::add(int64_t id) {
  ids_.push_back(id);
  const std::string text = tok_.decode(ids_);
  if (text.size() > shown_.size() && text.compare(0, shown_.size(), shown_) == 0) {
    std::fputs(text.c_str() + shown_.size(), stdout);
    std::fflush(stdout);
    shown_ = text;
  }
}

}  // namespace lt::data
