// Process memory readings (Linux /proc): resident set now and at its peak (VmHWM).
// Ranks that are threads share one process, so these are per process, not per thread-rank.
#pragma once
#include <cstdint>

namespace lt {
int64_t peakRssBytes();
int64_t currentRssBytes();
}  // namespace lt
