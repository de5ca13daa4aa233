// Out-of-line failure paths of LT_CHECK / LT_ASSERT, so the hot path stays a compare.
#include "longtrain/core/check.h"

namespace lt::detail {

void checkFail(const std::string& msg) { throw Error(msg); }

void assertFail(const char* cond, const char* file, int line, const std::string& msg) {
  throw Error(concat("internal error: assertion `", cond, "` failed at ", file, ":", line,
                     msg.empty() ? "" : ": ", msg));
}

}  // namespace lt::detail
