// Reads VmHWM / VmRSS from /proc/self/status; returns -1 where they cannot be read.
#include "longtrain/core/memory.h"

#include <cstdio>
#include <cstring>

namespace lt {
namespace {
int64_t readStatusKb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
      long long v = 0;
      if (std::sscanf(line + n + 1, "%lld", &v) == 1) kb = v;
      break;
    }
  }
  std::fclose(f);
  return kb;
}
}  // namespace

int64_t peakRssBytes() {
  int64_t kb = readStatusKb("VmHWM");
  return kb < 0 ? -1 : kb * 1024;
}
int64_t currentRssBytes() {
  int64_t kb = readStatusKb("VmRSS");
  return kb < 0 ? -1 : kb * 1024;
}
}  // namespace lt
