// Ring attention and the Ulysses x ring hybrid (sequence parallelism beyond the head count).
// Each rank keeps its query shard; the key/value shards of the R ranks of its ring group pass it
// one point-to-point step at a time, and the partial attentions over each shard are merged by
// log-sum-exp; backward sends each shard's dK/dV partial sum round the ring behind its K/V, so
// it ends at its owner. Autograd flows through it like through the Ulysses all-to-alls.
// Non-obvious decision: the K/V shards travel as R-1 dependent send/recv steps, each overlapped
// with the fused kernel's work on the shard held, not as one all-gather: a rank holds two shards
// whatever R is, and the saved activations stay O(S / P) (backward passes K/V round again).
// Masks are by global token index (a key is seen iff documentStart <= key <= query), so any
// placement of tokens (zigzag, padding), packed documents and a sliding window (a later
// documentStart: query - W + 1) are exact.
#pragma once
#include <memory>

#include "longtrain/comm/comm.h"
#include "longtrain/model/model.h"
#include "longtrain/sp/layout.h"
#include "longtrain/sp/ulysses.h"

namespace lt::sp {

struct RingInputs {
  at::Tensor queryIndex;     // [n] int64: global position of each local query token
  at::Tensor keyIndex;       // [R * n] int64: global position of ring rank t's tokens at [t n, (t+1) n)
  at::Tensor documentStart;  // [B, n] int64: first global position each query may see; undefined: 0
  comm::Comm* ring = nullptr;  // the ring group (R ranks); null: R = 1 (masked local attention)
  int64_t chunk = 0;           // the fused kernel's tile edge (0: its default)
  bool bf16 = false;           // its tile products in bf16 (model::attentionInBf16)
  // If set, the seconds spent on tiles (forward and backward, not waiting for the ring) are
  // added to it: benches measure the per-rank work (zigzag's balance) with it.
  double* computeSeconds = nullptr;
};

// q [B, n, H, Dh], k and v [B, n, KV, Dh] (this rank's tokens; H a multiple of KV) ->
// [B, n, H, Dh]: causal attention of the local queries over the tokens of every ring rank.
// Differentiable in q, k and v. Every ring rank must call it with the same shapes.
at::Tensor ringAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingInputs& in);

// The attention function for SP under `layout`: Ulysses all-to-alls over the `ulysses` group
// (U ranks; null when U = 1), ring attention over the `ring` group (R ranks; null when R = 1).
// With layout.ulyssesOnly() it is ulyssesAttention(ulysses, core, pipeline); other layouts
// leave `pipeline` unused (the ring kernel is the core).
// `spRank` is this rank's rank in the SP group; `chunk` the ring kernel's tile edge (0: the fused
// kernel's default); `window` the sliding window (0: none; Ulysses-only layouts leave it to `core`);
// `bf16` the ring kernel's tile products in bf16, as `core`'s are (model::attentionInBf16).
model::AttentionFn sequenceParallelAttention(std::shared_ptr<comm::Comm> ulysses, std::shared_ptr<comm::Comm> ring,
                                             const ParallelLayout& layout, int spRank, model::AttentionFn core,
                                             int64_t chunk = 0, double* computeSeconds = nullptr,
                                             int64_t window = 0, const UlyssesPipeline& pipeline = {},
                                             bool bf16 = false);

}  // namespace lt::sp
