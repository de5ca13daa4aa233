// The bytes ZeRO's collectives hold, declared beside their code (zero/sharded_optimizer.cpp) for
// `longtrain plan`: a ZeRO-3 gather, a bucket's reduce-scatter, the masters' all-gather.
// Non-obvious: a group's gather is one collective, and Gloo runs it through buffers of its own
// (the whole group's bytes as they travel), so that transient is a block's size, not a parameter's.
#pragma once
#include <algorithm>

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

// ShardedOptimizer::onBucket (stages 1-3) as a bucket of `bucketElems` full gradients completes:
// `saved`, those gradients (held from the backward that made them); `work`, a piece's [W, run]
// send buffer (runs of at most max(reduce_bucket_size, the largest parameter) elements), one
// padded gradient and, over W > 1 ranks, the reduce-scatter's receive buffer.
inline Footprint bucketReduceFootprint(double bucketElems, double reduceBucketSize, double maxParamElems,
                                       double world) {
  const double piece = std::min(bucketElems, std::max(reduceBucketSize, maxParamElems));
  Footprint f;
  f.saved.add(1, bucketElems * 4);
  f.work.add(world > 1 ? 2 : 1, piece * 4);
  f.work.add(1, maxParamElems * 4);
  return f;
}

// ShardedOptimizer::gatherReplicas (stages 1 and 2, after Adam): the fp32 masters all-gathered in
// runs of allgather_bucket_size elements (or the largest parameter), two runs alive at once.
inline TensorBytes masterGatherFootprint(double params, double allgatherBucketSize, double maxParamElems) {
  TensorBytes t;
  t.add(2, std::min(params, std::max(allgatherBucketSize, maxParamElems)) * 4);
  return t;
}

}  // namespace lt::zero
