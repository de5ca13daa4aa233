// Placing a sequence over the P ranks of an SP group, by the job's config::ParallelLayout
// (Ulysses x ring, contiguous or zigzag shards, padded to a multiple of P, 2P for zigzag).
// Non-obvious: shift_labels are formed before padding, so the last real token keeps label -100
// exactly as on one rank, and the padding carries -100 throughout.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "longtrain/config/parallel_layout.h"
#include "longtrain/data/data.h"

namespace lt::sp {

using config::ParallelLayout;

// The positions in the padded sequence of SP rank `spRank`'s n local tokens, in local order
// (ascending). [n] int64.
at::Tensor tokenIndex(const ParallelLayout& layout, int spRank, int64_t n);

// SP rank `spRank`'s shard of a whole batch [B, S]: shift_labels formed on the unpadded
// sequence (if absent), padded to layout.paddedLength(S) (ids 0, labels -100, positions
// restarting at 0: the padding is a document of its own that no real token sees), then the
// rank's tokens selected. Every field [B, paddedLength / P].
data::Batch shardBatch(const data::Batch& whole, int spRank, const ParallelLayout& layout);

}  // namespace lt::sp
