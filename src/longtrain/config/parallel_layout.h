// How a job's ranks divide the work: world = SP x DP, and an SP group's P = U x R (Ulysses x
// ring), its sequence in contiguous or zigzag shards, padded to a multiple of P (2P for
// zigzag). The one owner of every divisibility rule and derived size (torchtitan's
// ParallelDims): the config's validation, the engine, the memory model and the ladder ask it.
// Non-obvious: SP rank s = ring rank x U + Ulysses rank, so the U ranks of a Ulysses group
// (the all-to-all, the heavier traffic) are adjacent ranks, and ring groups stride by U.
// Zigzag cuts the padded sequence into 2P chunks; SP rank s holds chunks s and 2P-1-s, so
// every rank holds one early and one late chunk and does the same causal attention work.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "longtrain/config/options.h"

namespace lt::config {

struct ParallelLayout {
  int world = 1;  // ranks in the job
  int P = 1;      // sequence_parallel_size
  int dp = 1;     // data-parallel size: world / P
  int U = 1;      // Ulysses degree: heads split over U adjacent ranks
  int R = 1;      // ring degree: K/V gathered over R ranks that stride by U
  bool zigzag = false;

  // Checks and splits (errors name the key, the value and the fix): P divides the world; U
  // is the largest divisor of P that the query heads allow (heads % U == 0) and the kv heads
  // allow or replicate (kvHeads % U == 0 or U % kvHeads == 0), R = P / U; forcedRing > 0
  // (sequence_parallel_ring_degree) forces R. balance: Auto (zigzag when R > 1),
  // Contiguous or Zigzag.
  static ParallelLayout make(int world, int P, int64_t heads, int64_t kvHeads, int forcedRing,
                             SpBalance balance);

  int ringRankOf(int spRank) const { return spRank / U; }
  int ulyssesRankOf(int spRank) const { return spRank % U; }
  int spRankOf(int ringRank, int ulyssesRank) const { return ringRank * U + ulyssesRank; }
  // seq_len needs no padding at a multiple of this.
  int64_t unit() const { return zigzag ? 2 * P : P; }
  // The padded length of a sequence of S tokens: the next multiple of unit().
  int64_t paddedLength(int64_t S) const { return (S + unit() - 1) / unit() * unit(); }
  // True when the plain Ulysses path is exact: no ring and contiguous shards.
  bool ulyssesOnly() const { return R == 1 && !zigzag; }
  std::string describe() const;  // e.g. "Ulysses 2 x ring 2, zigzag"

  // The world ranks of every group of a kind, each ascending, as comm::makeGroups forms them
  // (comm cannot depend on config, so it restates the rule; this is what the time model places
  // on nodes): SP group i is ranks iP .. iP+P-1, its Ulysses groups U adjacent ranks, its ring
  // groups R ranks striding by U.
  using Groups = std::vector<std::vector<int>>;
  Groups ulyssesGroups() const;
  Groups ringGroups() const;
};

}  // namespace lt::config
