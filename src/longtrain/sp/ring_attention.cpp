// Ring attention: the local queries attend to every ring rank's K/V shard, the shards passed
// round the ring one step at a time (P2P), each step's pass overlapped with the compute on the
// shard held, so a rank holds two K/V shards, never R. Backward passes each shard's dK/dV partial
// sum round the ring one step behind its K/V, so the sum reaches its owner with no all-gather or
// reduce-scatter, and the same bytes.
// Non-obvious: the compute is the fused attention kernel (kernels/fused_attention.h) on blocks of
// consecutive global positions. A rank's tokens are a few such runs (one shard; two chunks under
// zigzag; U shards under Ulysses), so a (query run, key run) pair is either one run with itself
// (causal), keys wholly earlier (every key visible to queryOffset), or keys wholly later
// (skipped). Forward merges the pairs' outputs by their log-sum-exps; backward reruns each pair
// with the merged output and log-sum-exp, which makes its dq, dk, dv exactly the pair's share.
#include "longtrain/sp/ring_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "longtrain/config/validate.h"
#include "longtrain/core/check.h"
#include "longtrain/kernels/fused_attention.h"
#include "longtrain/model/footprint.h"
#include "longtrain/sp/footprint.h"
#include "longtrain/sp/ulysses.h"

namespace lt::sp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> toVector(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Local tokens [at, at + len) hold the consecutive global positions [first, first + len).
struct Run {
  int64_t at, len, first;
  int64_t last() const { return first + len - 1; }
};

std::vector<Run> runsOf(const at::Tensor& index) {
  const auto idx = toVector(index);
  std::vector<Run> runs;
  for (int64_t i = 0; i < static_cast<int64_t>(idx.size()); ++i) {
    if (!runs.empty() && idx[i] == runs.back().last() + 1) ++runs.back().len;
    else runs.push_back({i, 1, idx[i]});
  }
  return runs;
}

// The local query rows of one run, cut once per call: the kernel takes contiguous [B, len, ...]
// tensors (a slice of a batch of 2 or more is not).
struct QueryBlock {
  Run run;
  at::Tensor q, start;  // start: global first visible position [B, len] (undefined: none)
};

// The kernel's options for the queries of `qb` over the key run `k`; false when no query sees
// any of its keys (all later, or all before every query's document).
bool pairOptions(const QueryBlock& qb, const Run& k, int64_t tile, bool bf16, kernels::FusedAttentionOptions& o) {
  if (k.first > qb.run.last()) return false;
  o = {};
  o.tile = tile;
  o.bf16 = bf16;
  o.queryOffset = qb.run.first - k.first;
  if (qb.start.defined()) {
    o.documentStart = (qb.start - k.first).clamp(0, k.len);  // k.len: this row sees none of these keys
    if (o.documentStart.min().item<int64_t>() >= k.len) return false;
  }
  return true;
}

// Folds one pair's output and log-sum-exp (rows [0, len) of `part`) into the running ones at
// rows [at, at + len): out [B, n, H, D], lse [B, H, n]. A row with no key yet has lse -inf.
void mergeInto(at::Tensor& out, at::Tensor& lse, const kernels::FusedAttentionResult& part, int64_t at) {
  const int64_t B = out.size(0), n = out.size(1), H = out.size(2), D = out.size(3), len = part.out.size(1);
  float *o = out.data_ptr<float>(), *l = lse.data_ptr<float>();
  const float *po = part.out.data_ptr<float>(), *pl = part.lse.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t bh = b0; bh < b1; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      for (int64_t i = 0; i < len; ++i) {
        const float c = pl[bh * len + i];
        float& a = l[bh * n + at + i];
        if (c == -std::numeric_limits<float>::infinity()) continue;
        float* row = o + ((b * n + at + i) * H + h) * D;
        const float* add = po + ((b * len + i) * H + h) * D;
        const float m = std::max(a, c), wa = std::exp(a - m), wc = std::exp(c - m), inv = 1.0f / (wa + wc);
        for (int64_t d = 0; d < D; ++d) row[d] = (row[d] * wa + add[d] * wc) * inv;
        a = m + std::log(wa + wc);
      }
    }
  });
}

comm::Comm* commFrom(int64_t ptr) { return reinterpret_cast<comm::Comm*>(static_cast<intptr_t>(ptr)); }

// Adds the seconds between construction and stop() to *sink (when there is one).
class ComputeTimer {
 public:
  explicit ComputeTimer(int64_t sinkPtr) : sink_(reinterpret_cast<double*>(static_cast<intptr_t>(sinkPtr))) {}
  void start() { t0_ = std::chrono::steady_clock::now(); }
  void stop() {
    if (sink_) *sink_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double* sink_;
  std::chrono::steady_clock::time_point t0_;
};

// Starts passing `held` one step round the ring: to the previous rank, while the next rank's
// arrives in `arriving`. So at step t a rank holds shard (rank + t) % R, the fold's order.
comm::Work passOn(comm::Comm* ring, const at::Tensor& held, at::Tensor& arriving) {
  arriving = at::empty_like(held);
  const int R = ring->size(), me = ring->rank();
  return ring->sendRecv(held, (me + R - 1) % R, arriving, (me + 1) % R);
}

std::vector<QueryBlock> queryBlocks(const at::Tensor& q, const at::Tensor& queryIndex, const at::Tensor& start) {
  std::vector<QueryBlock> blocks;
  for (const Run& r : runsOf(queryIndex)) {
    QueryBlock b{r, q.slice(1, r.at, r.at + r.len).contiguous(), at::Tensor()};
    if (start.numel() > 0) b.start = start.slice(1, r.at, r.at + r.len).contiguous();
    blocks.push_back(std::move(b));
  }
  return blocks;
}

// The key runs of ring rank `src`'s shard (positions keyIndex[src n, (src + 1) n)).
std::vector<Run> keyRuns(const at::Tensor& keyIndex, int src, int64_t n) {
  return runsOf(keyIndex.slice(0, src * n, (src + 1) * n));
}

struct RingFn : torch::autograd::Function<RingFn> {
  // q [B, n, H, D], k and v [B, n, KV, D]; queryIndex [n], start [B, n] (global first visible
  // position; empty: no documents), keyIndex [R n].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& queryIndex, const at::Tensor& start, const at::Tensor& keyIndex,
                            int64_t ringPtr, int64_t tile, bool bf16, int64_t timerPtr) {
    at::NoGradGuard ng;
    ComputeTimer timer(timerPtr);
    comm::Comm* ring = commFrom(ringPtr);
    const int R = ring ? ring->size() : 1, me = ring ? ring->rank() : 0;
    const int64_t n = k.size(1);
    const auto blocks = queryBlocks(q, queryIndex, start);
    auto out = at::zeros_like(q);
    auto lse = at::full({q.size(0), q.size(2), n}, -std::numeric_limits<float>::infinity(), q.options());
    at::Tensor held = at::stack({k, v}), arriving;  // [2, B, n, KV, D]
    for (int t = 0; t < R; ++t) {
      const int src = (me + t) % R;
      comm::Work inFlight = t + 1 < R ? passOn(ring, held, arriving) : comm::Work();
      timer.start();
      for (const Run& kr : keyRuns(keyIndex, src, n)) {
        const auto kk = held[0].slice(1, kr.at, kr.at + kr.len), vv = held[1].slice(1, kr.at, kr.at + kr.len);
        for (const auto& qb : blocks) {
          kernels::FusedAttentionOptions o;
          if (!pairOptions(qb, kr, tile, bf16, o)) continue;
          mergeInto(out, lse, kernels::fusedAttentionForward(qb.q, kk, vv, o), qb.run.at);
        }
      }
      timer.stop();
      inFlight.wait();
      if (t + 1 < R) held = arriving;
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["queryIndex"] = queryIndex;
    ctx->saved_data["start"] = start;
    ctx->saved_data["keyIndex"] = keyIndex;
    ctx->saved_data["ring"] = ringPtr;
    ctx->saved_data["tile"] = tile;
    ctx->saved_data["bf16"] = bf16;
    ctx->saved_data["timer"] = timerPtr;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::NoGradGuard ng;
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    comm::Comm* ring = commFrom(ctx->saved_data["ring"].toInt());
    const int64_t tile = ctx->saved_data["tile"].toInt(), n = k.size(1);
    const bool bf16 = ctx->saved_data["bf16"].toBool();
    const auto keyIndex = ctx->saved_data["keyIndex"].toTensor();
    const int R = ring ? ring->size() : 1, me = ring ? ring->rank() : 0;
    const auto blocks = queryBlocks(q, ctx->saved_data["queryIndex"].toTensor(), ctx->saved_data["start"].toTensor());
    auto dO = grads[0].contiguous();
    // Each block's merged output, log-sum-exp and output gradient: what every pair's backward reads.
    std::vector<kernels::FusedAttentionResult> merged;
    std::vector<at::Tensor> dOut;
    for (const auto& qb : blocks) {
      const int64_t a = qb.run.at, b = a + qb.run.len;
      merged.push_back({out.slice(1, a, b).contiguous(), lse.slice(2, a, b).contiguous()});
      dOut.push_back(dO.slice(1, a, b).contiguous());
    }
    auto dq = at::zeros_like(q);
    ComputeTimer timer(ctx->saved_data["timer"].toInt());
    // K/V go round again (forward kept only the local shard). Each other shard's dK/dV partial
    // sum follows one step behind its K/V, gaining each rank's contribution, and ends at its
    // owner, which adds its own contribution (computed first, while the first K/V step flies).
    at::Tensor held = at::stack({k, v}), arriving, own, partial;  // [2, B, n, KV, D] each
    comm::Work kvInFlight, partialInFlight;
    for (int t = 0; t < R; ++t) {
      const int src = (me + t) % R;
      if (t + 1 < R) kvInFlight = passOn(ring, held, arriving);
      auto dkv = at::zeros_like(held);
      timer.start();
      for (const Run& kr : keyRuns(keyIndex, src, n)) {
        const int64_t a = kr.at, b = kr.at + kr.len;
        const auto kk = held[0].slice(1, a, b), vv = held[1].slice(1, a, b);
        for (size_t i = 0; i < blocks.size(); ++i) {
          kernels::FusedAttentionOptions o;
          if (!pairOptions(blocks[i], kr, tile, bf16, o)) continue;
          auto g = kernels::fusedAttentionBackward(blocks[i].q, kk, vv, merged[i], dOut[i], o);
          dq.slice(1, blocks[i].run.at, blocks[i].run.at + blocks[i].run.len).add_(g.dq);
          dkv[0].slice(1, a, b).add_(g.dk);
          dkv[1].slice(1, a, b).add_(g.dv);
        }
      }
      timer.stop();
      if (t == 0) {
        own = dkv;
      } else {
        if (t > 1) {
          partialInFlight.wait();
          dkv.add_(partial);
        }
        partialInFlight = passOn(ring, dkv, partial);  // at t = R - 1 it reaches src's owner
      }
      kvInFlight.wait();
      if (t + 1 < R) held = arriving;
    }
    partialInFlight.wait();
    const at::Tensor mine = R > 1 ? own.add_(partial) : own;
    return {dq,          mine[0],     mine[1],     at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Positions [B, n] of every Ulysses rank's shard, in Ulysses-rank order: [B, U n].
at::Tensor gatherSequence(const at::Tensor& pos, comm::Comm* ulysses) {
  const int64_t U = ulysses->size(), B = pos.size(0), n = pos.size(1);
  auto all = at::empty({U * B * n}, at::kLong);
  ulysses->allGather(all, pos.to(at::kLong).contiguous().view({-1})).wait();
  return all.view({U, B, n}).permute({1, 0, 2}).reshape({B, U * n});
}

}  // namespace

at::Tensor ringAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingInputs& in) {
  const int64_t n = q.size(1);
  LT_ASSERT(q.size(2) % k.size(2) == 0 && k.size(1) == n && in.queryIndex.numel() == n && in.chunk >= 0);
  LT_ASSERT(in.keyIndex.numel() == n * (in.ring ? in.ring->size() : 1));
  auto start = in.documentStart.defined() ? in.documentStart.to(at::kLong).contiguous() : at::empty({0}, at::kLong);
  return RingFn::apply(q.contiguous(), k.contiguous(), v.contiguous(), in.queryIndex.to(at::kLong).contiguous(), start,
                       in.keyIndex.to(at::kLong).contiguous(), static_cast<int64_t>(reinterpret_cast<intptr_t>(in.ring)),
                       in.chunk, in.bf16, static_cast<int64_t>(reinterpret_cast<intptr_t>(in.computeSeconds)));
}

model::AttentionFn sequenceParallelAttention(std::shared_ptr<comm::Comm> ulysses, std::shared_ptr<comm::Comm> ring,
                                             const ParallelLayout& layout, int spRank, model::AttentionFn core,
                                             int64_t chunk, double* computeSeconds, int64_t window,
                                             const UlyssesPipeline& pipeline, bool bf16) {
  LT_ASSERT((layout.U == 1) == (!ulysses || ulysses->size() == 1) && (layout.R == 1) == (!ring || ring->size() == 1));
  LT_ASSERT(layout.spRankOf(ring ? ring->rank() : 0, ulysses ? ulysses->rank() : 0) == spRank);
  if (layout.ulyssesOnly()) return ulyssesAttention(ulysses, core, pipeline);
  if (layout.U == 1) ulysses = nullptr;
  if (layout.R == 1) ring = nullptr;
  return [ulysses, ring, layout, chunk, computeSeconds, window, bf16](const at::Tensor& q, const at::Tensor& k,
                                                                const at::Tensor& v, const at::Tensor& pos) {
    const int64_t n = q.size(1), U = layout.U;
    const int ringRank = ring ? ring->rank() : 0;
    at::Tensor qq = q, kk = k, vv = v, groupPos = pos;
    if (ulysses) {
      if (k.size(2) < U) {  // replicate KV heads so every Ulysses rank holds one
        kk = k.repeat_interleave(U / k.size(2), 2);
        vv = v.repeat_interleave(U / k.size(2), 2);
      }
      qq = seqToHeads(q, ulysses.get());  // [B, U n, H/U, Dh]
      kk = seqToHeads(kk, ulysses.get());
      vv = seqToHeads(vv, ulysses.get());
      if (pos.defined()) groupPos = gatherSequence(pos, ulysses.get());
    }
    // The tokens a Ulysses group holds after the all-to-all: its ranks' shards in rank order.
    auto groupTokens = [&](int ringRankOfGroup) {
      std::vector<at::Tensor> parts;
      for (int u = 0; u < U; ++u) parts.push_back(tokenIndex(layout, layout.spRankOf(ringRankOfGroup, u), n));
      return at::cat(parts);
    };
    RingInputs in;
    in.queryIndex = groupTokens(ringRank);
    std::vector<at::Tensor> keys;
    for (int t = 0; t < layout.R; ++t) keys.push_back(groupTokens(t));
    in.keyIndex = at::cat(keys);
    if (pos.defined()) in.documentStart = in.queryIndex.unsqueeze(0) - groupPos.to(at::kLong);
    if (window > 0) {  // nothing W or more tokens back, by global index
      auto inWindow = (in.queryIndex.unsqueeze(0) - (window - 1)).clamp_min(0);
      in.documentStart = pos.defined() ? at::maximum(in.documentStart, inWindow) : inWindow.expand({q.size(0), -1});
    }
    in.ring = ring.get();
    in.chunk = chunk;
    in.bf16 = bf16;
    in.computeSeconds = computeSeconds;
    auto o = ringAttention(qq, kk, vv, in);  // [B, U n, H/U, Dh]
    return ulysses ? headsToSeq(o.contiguous(), ulysses.get()) : o;
  };
}

// Per rank RingFn holds U s query tokens of H/U heads (uQ = [B, S/P, H x Dh] bytes) and U s
// tokens of max(KV/U, 1) kv heads (kv). It saves q, its output, the local k and v, and the
// log-sum-exp. Backward holds, whatever R is, the K/V shard it works on and the one arriving,
// and of dK/dV-sized buffers its own contribution, the one it computes, the one it sends and the
// partial sum arriving (R = 2: no send overlaps an arrival), 2 kv each; dO and dq; and for one
// (query run, key run) pair at a time the fused kernel's dq, dk, dv and K/V transposes (counted
// at a whole shard). With B > 1 a run's rows are not contiguous, so q, out and dO are copied.
Footprint ringAttentionFootprint(const StepShape& s) {
  const double uQ = s.rows(s.heads * s.headDim), kvHeads = std::max(s.kvHeads / s.ulysses, 1.0);
  const double kv = s.batch * s.ulysses * s.tokens * kvHeads * s.headDim * 4;
  Footprint f;
  f.saved.add(2, uQ);
  f.saved.add(2, kv);
  f.saved.add(1, s.batch * s.heads * s.tokens * 4);
  f.work.add(s.ring > 2 ? 12 : 8, kv);
  f.work.add(2, uQ);
  f.work.add(4, kv);  // one pair's dk, dv, kt, vt
  f.work.add(1, uQ);  // and its dq
  if (s.batch > 1) f.work.add(3, uQ);
  return f;
}

// As sequenceParallelAttention chooses: Ulysses alone around the model's core (pipelined over
// head groups with the fused core), else the ring kernel, with Ulysses' all-to-alls around it
// where U > 1 (their outputs are the q, k, v the ring kernel saves: counted there once).
Footprint attentionFootprint(const config::Config& c, const StepShape& s) {
  const ParallelLayout layout = config::layoutOf(c, c.sequenceParallelSize);
  const int groups = config::ulyssesHeadGroups(c, layout);
  if (groups > 1) return ulyssesPipelineFootprint(s, groups);
  Footprint f;
  if (layout.ulyssesOnly()) {
    f = model::attentionCoreFootprint(c.model, s, layout.P > 1);
  } else {
    f = ringAttentionFootprint(s);
  }
  if (layout.U > 1) f.add(ulyssesFootprint(s));
  return f;
}

}  // namespace lt::sp
