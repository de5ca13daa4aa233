// parseJsonText and readJsonFile. Non-obvious: the depth scan skips strings (with escapes) and,
// where comments are allowed, // and /* */ comments, so brackets inside them do not count.
#include "longtrain/config/json_text.h"


#include "longtrain/core/check.h"
#include "longtrain/core/files.h"

namespace lt::config {

namespace {

struct Where {
  size_t line = 1, column = 1;
};
Where whereIs(const std::string& text, size_t byte) {
  Where w;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') ++w.line, w.column = 1;
    else ++w.column;
  }
  return w;
}

// The offset where nesting first exceeds kMaxJsonDepth, or npos.
size_t tooDeepAt(const std::string& t, bool comments) {
  int depth = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '"') {
      for (++i; i < t.size() && t[i] != '"'; ++i)
        if (t[i] == '\\') ++i;
    } else if (comments && c == '/' && i + 1 < t.size() && t[i + 1] == '/') {
      while (i < t.size() && t[i] != '\n') ++i;
    } else if (comments && c == '/' && i + 1 < t.size() && t[i + 1] == '*') {
      const size_t end = t.find("*/", i + 2);
      i = end == std::string::npos ? t.size() : end + 1;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string::npos;
}

}  // namespace

void checkJsonDepth(const std::string& text, const std::string& what, bool comments) {
  if (const size_t at = tooDeepAt(text, comments); at != std::string::npos) {
    const Where w = whereIs(text, at);
    LT_CHECK(false, what, " is nested deeper than ", kMaxJsonDepth, " levels (line ", w.line, ", column ", w.column,
             "); no config or model file needs that many");
  }
}

nlohmann::json parseJsonText(const std::string& text, const std::string& what, bool comments) {
  checkJsonDepth(text, what, comments);
  try {
    return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/true, comments);
  } catch (const nlohmann::json::parse_error& e) {
    const Where w = whereIs(text, e.byte > 0 ? e.byte - 1 : 0);
    std::string detail = e.what();
    if (const size_t colon = detail.find(": ", detail.find("parse error")); colon != std::string::npos)
      detail = detail.substr(colon + 2);
    LT_CHECK(false, what, " is not valid JSON: line ", w.line, ", column ", w.column, ": ", detail);
  } catch (const nlohmann::json::exception& e) {  // a number too large for a double (1e99999)
    LT_CHECK(false, what, " is not valid JSON: ", e.what());
  }
  return {};
}

std::string readJsonFile(const std::string& path, const std::string& what) { return readInputFile(path, what); }

nlohmann::json readJson(const std::string& path, const std::string& what, bool comments) {
  return parseJsonText(readJsonFile(path, what), what, comments);
}

}  // namespace lt::config
