// Reads VmHWM / VmRSS from /proc/self/status; returns -1 where they cannot be read.
// The allocator is named by a symbol only it exports, looked up at run time.
#include "longtrain/core/memory.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

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
namespace {
// The first integer in a file ("max" and unreadable files give -1).
int64_t readIntFile(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (!f) return -1;
  long long v = -1;
  if (std::fscanf(f, "%lld", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}
int64_t memAvailableBytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (long long v = 0; std::sscanf(line, "MemAvailable: %lld kB", &v) == 1) kb = v;
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}
}  // namespace

int64_t rankMemoryLimitBytes(int localRanks) {
  int64_t avail = memAvailableBytes();
  if (avail < 0) return -1;
  const std::pair<const char*, const char*> cgroups[] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& [limitPath, usePath] : cgroups) {
    const int64_t limit = readIntFile(limitPath), use = readIntFile(usePath);
    if (limit > 0 && use >= 0 && limit < (int64_t{1} << 60)) avail = std::min(avail, std::max<int64_t>(0, limit - use));
  }
  return avail / (localRanks > 0 ? localRanks : 1);
}

namespace {
// A tcmalloc numeric property through gperftools' C entry point, looked up: no link dependency
// on tcmalloc. False under another allocator.
bool tcmallocProperty(const char* name, size_t* value) {
  using GetProperty = int (*)(const char*, size_t*);
  auto get = reinterpret_cast<GetProperty>(dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty"));
  return get && get(name, value);
}
}  // namespace

int64_t allocatorFreeBytes() {
  // Only the page heap's free pages: any later allocation can take them, while the size-class
  // caches (central, transfer, per-thread) serve only their own small size and stay resident
  // beside the tensors.
  size_t v = 0;
  return tcmallocProperty("tcmalloc.pageheap_free_bytes", &v) ? static_cast<int64_t>(v) : -1;
}

bool freedMemoryDecommitted() {
  size_t v = 0;
  return tcmallocProperty("tcmalloc.aggressive_memory_decommit", &v) && v != 0;
}

namespace {
bool setTcmallocProperty(const char* name, size_t value) {
  using SetProperty = int (*)(const char*, size_t);
  auto set = reinterpret_cast<SetProperty>(dlsym(RTLD_DEFAULT, "MallocExtension_SetNumericProperty"));
  return set && set(name, value);
}
}  // namespace

bool decommitFreedMemory() {
  if (!setTcmallocProperty("tcmalloc.aggressive_memory_decommit", 1)) return false;
  auto release = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"));
  if (release) release();  // what start-up freed
  return true;
}

bool keepFreedMemory() { return setTcmallocProperty("tcmalloc.aggressive_memory_decommit", 0); }

std::string allocatorName() {
  if (dlsym(RTLD_DEFAULT, "tc_version")) return "tcmalloc";
  if (dlsym(RTLD_DEFAULT, "mallctl")) return "jemalloc";
  return "glibc";
}
}  // namespace lt

int64_t lt::openFileDescriptors() {
  std::error_code ec;
  int64_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    ++n;
  return ec ? -1 : n - 1;  // the iterator's own descriptor
}
