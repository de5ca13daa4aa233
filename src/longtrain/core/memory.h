// Process memory readings (Linux /proc): resident set now and at its peak (VmHWM).
// Ranks that are threads share one process, so these are per process, not per thread-rank.
#pragma once
#include <cstdint>
#include <string>

namespace lt {
int64_t peakRssBytes();
int64_t currentRssBytes();
// Open file descriptors of this process (entries of /proc/self/fd); -1 where unreadable.
int64_t openFileDescriptors();
// The malloc this process runs: "tcmalloc", "jemalloc" or "glibc" (found by their symbols,
// so an LD_PRELOAD counts too).
std::string allocatorName();
// Bytes of this process's resident memory the allocator holds free for any later allocation to
// reuse before RSS grows (tcmalloc's page heap); -1 under another allocator.
int64_t allocatorFreeBytes();
// From now on the allocator returns each freed span's pages to the OS at once (tcmalloc's
// aggressive decommit), so the resident set follows the bytes in use and a span that later
// requests split cannot pile up; a reallocation faults its pages in again. False under another
// allocator.
bool decommitFreedMemory();
bool freedMemoryDecommitted();  // whether decommitFreedMemory has taken effect
// Back to keeping freed spans for reuse (tcmalloc's default): for a process that runs one job
// after another (the tests). False under another allocator.
bool keepFreedMemory();
// Memory one of `localRanks` ranks on this host may use: the smaller of MemAvailable and
// the cgroup's limit (v2 memory.max, v1 limit_in_bytes) less the cgroup's current use,
// divided among the local ranks; -1 where /proc/meminfo cannot be read.
int64_t rankMemoryLimitBytes(int localRanks);
}  // namespace lt
