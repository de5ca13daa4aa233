// The ZeRO partition rule, one definition for zero/ (which partitions), ckpt/ (which reads and
// writes the pieces) and comm/ (whose reduce-scatter hands them out): a buffer of numel
// elements over world ranks gives each rank ceil(numel / world) consecutive elements, rank r
// from r x chunk; the last ranks' pieces are shorter or empty.
#pragma once
#include <algorithm>
#include <cstdint>

namespace lt {

inline int64_t partitionChunk(int64_t numel, int64_t world) { return (numel + world - 1) / world; }

// Rank r's elements [begin, end) of a numel-element buffer.
struct PartitionRange {
  int64_t begin = 0, end = 0;
  int64_t length() const { return end - begin; }
};
inline PartitionRange partitionRange(int64_t numel, int64_t world, int64_t rank) {
  const int64_t c = partitionChunk(numel, world);
  return {std::min(numel, rank * c), std::min(numel, (rank + 1) * c)};
}

// A rank's piece of one parameter's fp32 state: elements [offset, offset + length) of the
// flattened parameter, pointing into the live buffers (writing them sets the state).
struct StateShard {
  int param;  // index in Model::parameters() order
  int64_t offset, length;
  float* master;
  float* expAvg;    // Adam m
  float* expAvgSq;  // Adam v
};

}  // namespace lt
