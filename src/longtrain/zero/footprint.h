// The bytes a ZeRO-3 gather holds beside the parameters it gathers, declared beside its code
// (ShardedOptimizer::prefetch) for `longtrain plan`. Non-obvious: a group's gather is one
// collective, and Gloo runs it through buffers of its own (the whole group's bytes as they
// travel), so this transient is a block's size, not a parameter's.
#pragma once
#include "longtrain/core/footprint.h"

namespace lt::zero {

// While the all-gather of a group of `wireBytes` (its elements at the bytes they travel as: 2
// for a bf16-gathered matrix, else 4) runs over `world` ranks: Gloo's flat receive buffer and the
// packed send buffer of this rank's shards. One rank moves nothing.
inline TensorBytes gatherFootprint(double wireBytes, double world) {
  TensorBytes t;
  if (world <= 1) return t;
  t.add(1, wireBytes);
  t.add(1, wireBytes / world);
  return t;
}

}  // namespace lt::zero
