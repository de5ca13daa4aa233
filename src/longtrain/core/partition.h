// The ZeRO-3 partition rule, one definition for zero/ (which partitions) and ckpt/ (which reads
// and writes the pieces): a parameter of numel elements over world ranks gives each rank
// ceil(numel / world) consecutive elements, rank r from r x chunk, the last ones padded.
#pragma once
#include <cstdint>

namespace lt {

inline int64_t partitionChunk(int64_t numel, int64_t world) { return (numel + world - 1) / world; }

}  // namespace lt
