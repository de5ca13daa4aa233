// LT_CHECK and LT_ASSERT: the two kinds of check, both always on, both throwing lt::Error.
// LT_CHECK guards a user's input (its message names what was given, what was expected and
// the fix); LT_ASSERT guards the code's own invariants (its message is the failed condition).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace lt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  ((os << args), ...);
  return os.str();
}
[[noreturn]] void checkFail(const std::string& msg);
[[noreturn]] void assertFail(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace lt

#define LT_CHECK(cond, ...)                                            \
  do {                                                                 \
    if (!(cond)) [[unlikely]]                                          \
      ::lt::detail::checkFail(::lt::detail::concat(__VA_ARGS__));      \
  } while (0)

#define LT_ASSERT(cond, ...)                                                             \
  do {                                                                                   \
    if (!(cond)) [[unlikely]]                                                            \
      ::lt::detail::assertFail(#cond, __FILE__, __LINE__, ::lt::detail::concat(__VA_ARGS__)); \
  } while (0)
