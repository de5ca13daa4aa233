// How a sequence is laid out over the P ranks of an SP group: the Ulysses x ring split
// (P = U x R), contiguous or zigzag shards, and padding to a multiple of P (2P for zigzag).
// Non-obvious: SP rank s = ring rank x U + Ulysses rank, so the U ranks of a Ulysses group
// (the all-to-all, the heavier traffic) are adjacent ranks, and ring groups stride by U.
// Zigzag cuts the padded sequence into 2P chunks; SP rank s holds chunks s and 2P-1-s, so
// every rank holds one early and one late chunk and does the same causal attention work.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "longtrain/data/data.h"

namespace lt::sp {

struct Layout {
  int P = 1;  // sequence_parallel_size
  int U = 1;  // Ulysses degree: heads split over U adjacent ranks
  int R = 1;  // ring degree: K/V gathered over R ranks that stride by U
  bool zigzag = false;

  int ringRankOf(int spRank) const { return spRank / U; }
  int ulyssesRankOf(int spRank) const { return spRank % U; }
  int spRankOf(int ringRank, int ulyssesRank) const { return ringRank * U + ulyssesRank; }
  int64_t unit() const { return zigzag ? 2 * P : P; }
  // The padded length of a sequence of S tokens: the next multiple of unit().
  int64_t paddedLength(int64_t S) const { return (S + unit() - 1) / unit() * unit(); }
  // The positions in the padded sequence of SP rank `spRank`'s n local tokens, in local order
  // (ascending). [n] int64.
  at::Tensor tokenIndex(int spRank, int64_t n) const;
  // True when the plain Ulysses path is exact: no ring and contiguous shards.
  bool ulyssesOnly() const { return R == 1 && !zigzag; }
  std::string describe() const;  // e.g. "Ulysses 2 x ring 2, zigzag"
};

// Splits P: U is the largest divisor of P that the query heads allow (heads % U == 0) and the
// kv heads allow or replicate (kvHeads % U == 0 or U % kvHeads == 0); R = P / U. forcedRing > 0
// (sequence_parallel_ring_degree) forces R. balance is "auto" (zigzag when R > 1), "contiguous"
// or "zigzag". Errors name the key, the value and the fix.
Layout chooseLayout(int P, int64_t heads, int64_t kvHeads, int forcedRing, const std::string& balance);

// SP rank `spRank`'s shard of a whole batch [B, S]: shift_labels formed on the unpadded
// sequence (if absent), padded to layout.paddedLength(S) (ids 0, labels -100, positions
// restarting at 0: the padding is a document of its own that no real token sees), then the
// rank's tokens selected. Every field [B, paddedLength / P].
data::Batch shardBatch(const data::Batch& whole, int spRank, const Layout& layout);

}  // namespace lt::sp
