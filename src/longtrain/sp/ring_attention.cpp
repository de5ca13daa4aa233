// Ring attention: a blocked online softmax of the local query rows over the key blocks of
// every ring rank's shard, the shards passed round the ring one step at a time (P2P), each step's
// pass overlapped with the compute on the shard held, so a rank holds two K/V shards, never R.
// Backward passes each shard's dK/dV partial sum round the ring one step behind its K/V, so
// the sum reaches its owner with no all-gather or reduce-scatter, and the same bytes.
// Non-obvious: query heads are grouped under their kv head ([B, KV, G*n, D] rows), so GQA
// reads each kv head once and dK/dV sum over the group inside the GEMMs; and each tile is
// classified from its index bounds as skipped (no key visible), full (every key visible: no
// mask built) or masked, so causal tiles above the diagonal cost nothing.
#include "longtrain/sp/ring_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "longtrain/config/validate.h"
#include "longtrain/core/check.h"
#include "longtrain/model/footprint.h"
#include "longtrain/sp/footprint.h"
#include "longtrain/sp/ulysses.h"

namespace lt::sp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A running max that is never -inf, so a row with no visible key in a tile stays NaN-free.
constexpr double kNoScore = -1e30;

std::vector<int64_t> toVector(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// The query rows' global indices and document starts, and their bounds per row (over the batch).
struct Rows {
  at::Tensor index, start;  // [M], [B, M] (undefined: no documents)
  std::vector<int64_t> idx, startMin, startMax;
  Rows(const at::Tensor& index_, const at::Tensor& start_) : index(index_), idx(toVector(index_)) {
    if (start_.numel() > 0) {
      start = start_;
      startMin = toVector(std::get<0>(start_.min(0)));
      startMax = toVector(std::get<0>(start_.max(0)));
    } else {
      startMin.assign(idx.size(), 0);
      startMax.assign(idx.size(), 0);
    }
  }
};

enum class Tile { Skip, Full, Masked };

Tile classify(const Rows& rows, int64_t r0, int64_t r1, const std::vector<int64_t>& keys, int64_t c0, int64_t c1) {
  int64_t rMin = rows.idx[r0], rMax = rMin, sMin = rows.startMin[r0], sMax = rows.startMax[r0];
  for (int64_t r = r0; r < r1; ++r) {
    rMin = std::min(rMin, rows.idx[r]), rMax = std::max(rMax, rows.idx[r]);
    sMin = std::min(sMin, rows.startMin[r]), sMax = std::max(sMax, rows.startMax[r]);
  }
  int64_t kMin = keys[c0], kMax = kMin;
  for (int64_t c = c0; c < c1; ++c) kMin = std::min(kMin, keys[c]), kMax = std::max(kMax, keys[c]);
  if (kMin > rMax || kMax < sMin) return Tile::Skip;
  if (kMax <= rMin && kMin >= sMax) return Tile::Full;
  return Tile::Masked;
}

// Scaled scores of rows [r0, r1) against keys [c0, c1) of one source, masked unless Full. [B, KV, r, c]
at::Tensor tileScores(const at::Tensor& q, const at::Tensor& k, const Rows& rows, const at::Tensor& keyIndex,
                      int64_t r0, int64_t r1, int64_t c0, int64_t c1, Tile tile) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  auto s = at::matmul(q.slice(2, r0, r1), k.slice(2, c0, c1).transpose(-2, -1)) * scale;
  if (tile == Tile::Full) return s;
  auto cols = keyIndex.slice(0, c0, c1).view({1, -1});
  auto hidden = cols > rows.index.slice(0, r0, r1).view({-1, 1});  // [r, c]: key after the query
  if (rows.start.defined()) {  // or before the query's document start
    auto before = cols.unsqueeze(0) < rows.start.slice(1, r0, r1).unsqueeze(-1);  // [B, r, c]
    return s.masked_fill((hidden.unsqueeze(0) | before).unsqueeze(1), -std::numeric_limits<float>::infinity());
  }
  return s.masked_fill(hidden, -std::numeric_limits<float>::infinity());
}

// The online softmax's running state over all query rows: max, sum, weighted values.
struct Softmax {
  at::Tensor m, l, acc;  // [B, KV, M, 1], [B, KV, M, 1], [B, KV, M, D]
  explicit Softmax(const at::Tensor& q)
      : m(at::full({q.size(0), q.size(1), q.size(2), 1}, kNoScore, q.options())),
        l(at::zeros({q.size(0), q.size(1), q.size(2), 1}, q.options())),
        acc(at::zeros_like(q)) {}
};

// Folds one source shard's keys k, v [B, KV, n, D] (global indices `keys`) into the state.
void forwardSource(Softmax& st, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Rows& rows,
                   const at::Tensor& keyIndex, int64_t chunk) {
  const auto keys = toVector(keyIndex);
  const int64_t M = q.size(2), n = k.size(2);
  for (int64_t r0 = 0; r0 < M; r0 += chunk) {
    const int64_t r1 = std::min(M, r0 + chunk);
    auto m = st.m.slice(2, r0, r1), l = st.l.slice(2, r0, r1), acc = st.acc.slice(2, r0, r1);
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t c1 = std::min(n, c0 + chunk);
      const Tile tile = classify(rows, r0, r1, keys, c0, c1);
      if (tile == Tile::Skip) continue;
      auto s = tileScores(q, k, rows, keyIndex, r0, r1, c0, c1, tile);
      auto mNew = at::maximum(m, std::get<0>(s.max(-1, true)));
      auto p = s.sub_(mNew).exp_();  // in place: the scores are not needed again
      auto corr = (m - mNew).exp_();
      l.mul_(corr).add_(p.sum(-1, true));
      acc.mul_(corr).add_(at::matmul(p, v.slice(2, c0, c1)));
      m.copy_(mNew);
    }
  }
}

// Adds one source's contribution to dq and writes its dk, dv [B, KV, n, D] (zeroed by the caller).
void backwardSource(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dO,
                    const at::Tensor& lse, const at::Tensor& delta, const Rows& rows, const at::Tensor& keyIndex,
                    int64_t chunk, at::Tensor& dq, at::Tensor dk, at::Tensor dv) {
  const auto keys = toVector(keyIndex);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const int64_t M = q.size(2), n = k.size(2);
  for (int64_t r0 = 0; r0 < M; r0 += chunk) {
    const int64_t r1 = std::min(M, r0 + chunk);
    auto dOi = dO.slice(2, r0, r1), qi = q.slice(2, r0, r1);
    auto lsei = lse.slice(2, r0, r1), deltai = delta.slice(2, r0, r1);
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t c1 = std::min(n, c0 + chunk);
      const Tile tile = classify(rows, r0, r1, keys, c0, c1);
      if (tile == Tile::Skip) continue;
      auto p = tileScores(q, k, rows, keyIndex, r0, r1, c0, c1, tile).sub_(lsei).exp_();  // [B, KV, r, c]
      dv.slice(2, c0, c1).add_(at::matmul(p.transpose(-2, -1), dOi));
      auto ds = at::matmul(dOi, v.slice(2, c0, c1).transpose(-2, -1)).sub_(deltai).mul_(p).mul_(scale);
      dq.slice(2, r0, r1).add_(at::matmul(ds, k.slice(2, c0, c1)));
      dk.slice(2, c0, c1).add_(at::matmul(ds.transpose(-2, -1), qi));
    }
  }
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

struct RingFn : torch::autograd::Function<RingFn> {
  // q [B, KV, M, D] (query heads grouped under their kv head), k and v [B, KV, n, D];
  // rowIndex [M], rowStart [B, M] (empty: no documents), keyIndex [R n].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& rowIndex, const at::Tensor& rowStart, const at::Tensor& keyIndex,
                            int64_t ringPtr, int64_t chunk, int64_t timerPtr) {
    at::NoGradGuard ng;
    ComputeTimer timer(timerPtr);
    comm::Comm* ring = commFrom(ringPtr);
    const int R = ring ? ring->size() : 1, me = ring ? ring->rank() : 0;
    const int64_t n = k.size(2);
    const Rows rows(rowIndex, rowStart);
    Softmax st(q);
    at::Tensor held = R > 1 ? at::stack({k, v}) : at::Tensor(), arriving;  // [2, B, KV, n, D]
    for (int t = 0; t < R; ++t) {
      const int src = (me + t) % R;
      comm::Work inFlight = t + 1 < R ? passOn(ring, held, arriving) : comm::Work();
      timer.start();
      forwardSource(st, q, R > 1 ? held[0] : k, R > 1 ? held[1] : v, rows, keyIndex.slice(0, src * n, (src + 1) * n),
                    chunk);
      timer.stop();
      inFlight.wait();
      if (t + 1 < R) held = arriving;
    }
    timer.start();
    auto out = st.acc / st.l;
    auto lse = st.m + at::log(st.l);
    timer.stop();
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["rowIndex"] = rowIndex;
    ctx->saved_data["rowStart"] = rowStart;
    ctx->saved_data["keyIndex"] = keyIndex;
    ctx->saved_data["ring"] = ringPtr;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["timer"] = timerPtr;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::NoGradGuard ng;
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    comm::Comm* ring = commFrom(ctx->saved_data["ring"].toInt());
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), n = k.size(2);
    const auto keyIndex = ctx->saved_data["keyIndex"].toTensor();
    const int R = ring ? ring->size() : 1, me = ring ? ring->rank() : 0;
    const Rows rows(ctx->saved_data["rowIndex"].toTensor(), ctx->saved_data["rowStart"].toTensor());
    auto dO = grads[0].contiguous();
    auto delta = (dO * out).sum(-1, true);  // [B, KV, M, 1]
    auto dq = at::zeros_like(q);
    ComputeTimer timer(ctx->saved_data["timer"].toInt());
    // K/V go round again (forward kept only the local shard). Each other shard's dK/dV partial
    // sum follows one step behind its K/V, gaining each rank's contribution, and ends at its
    // owner, which adds its own contribution (computed first, while the first K/V step flies).
    at::Tensor held = at::stack({k, v}), arriving, own, partial;  // [2, B, KV, n, D] each
    comm::Work kvInFlight, partialInFlight;
    for (int t = 0; t < R; ++t) {
      const int src = (me + t) % R;
      if (t + 1 < R) kvInFlight = passOn(ring, held, arriving);
      auto dkv = at::zeros_like(held);
      timer.start();
      backwardSource(q, held[0], held[1], dO, lse, delta, rows, keyIndex.slice(0, src * n, (src + 1) * n), chunk, dq,
                     dkv[0], dkv[1]);
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
    return {dq, mine[0], mine[1], at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
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
  const int64_t B = q.size(0), n = q.size(1), H = q.size(2), D = q.size(3), KV = k.size(2), G = H / KV;
  LT_ASSERT(H % KV == 0 && k.size(1) == n && in.queryIndex.numel() == n && in.chunk >= 1);
  LT_ASSERT(in.keyIndex.numel() == n * (in.ring ? in.ring->size() : 1));
  auto qg = q.permute({0, 2, 1, 3}).reshape({B, KV, G * n, D});  // head h = kv * G + g
  auto kk = k.permute({0, 2, 1, 3}).contiguous(), vv = v.permute({0, 2, 1, 3}).contiguous();  // [B, KV, n, D]
  auto rowIndex = in.queryIndex.to(at::kLong).repeat({G});
  auto rowStart = in.documentStart.defined() ? in.documentStart.to(at::kLong).repeat({1, G}).contiguous()
                                             : at::empty({0}, at::kLong);
  auto o = RingFn::apply(qg.contiguous(), kk, vv, rowIndex, rowStart, in.keyIndex.to(at::kLong).contiguous(),
                         static_cast<int64_t>(reinterpret_cast<intptr_t>(in.ring)), in.chunk,
                         static_cast<int64_t>(reinterpret_cast<intptr_t>(in.computeSeconds)));
  return o.view({B, H, n, D}).permute({0, 2, 1, 3});  // [B, n, H, D]
}

model::AttentionFn sequenceParallelAttention(std::shared_ptr<comm::Comm> ulysses, std::shared_ptr<comm::Comm> ring,
                                             const ParallelLayout& layout, int spRank, model::AttentionFn core,
                                             int64_t chunk, double* computeSeconds, int64_t window,
                                             const UlyssesPipeline& pipeline) {
  LT_ASSERT((layout.U == 1) == (!ulysses || ulysses->size() == 1) && (layout.R == 1) == (!ring || ring->size() == 1));
  LT_ASSERT(layout.spRankOf(ring ? ring->rank() : 0, ulysses ? ulysses->rank() : 0) == spRank);
  if (layout.ulyssesOnly()) return ulyssesAttention(ulysses, core, pipeline);
  if (layout.U == 1) ulysses = nullptr;
  if (layout.R == 1) ring = nullptr;
  return [ulysses, ring, layout, chunk, computeSeconds, window](const at::Tensor& q, const at::Tensor& k,
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
    in.chunk = chunk > 0 ? chunk : 256;
    in.computeSeconds = computeSeconds;
    auto o = ringAttention(qq, kk, vv, in);  // [B, U n, H/U, Dh]
    return ulysses ? headsToSeq(o.contiguous(), ulysses.get()) : o;
  };
}

// Per rank RingFn holds U s query tokens of H/U heads (uQ = [B, S/P, H x Dh] bytes) and U s
// tokens of max(KV/U, 1) kv heads (kv). It saves q grouped under its kv head and its output,
// the local k and v, and the log-sum-exp. Backward holds, whatever R is, the K/V shard it
// works on and the one arriving, and of dK/dV-sized buffers its own contribution, the one it
// computes, the one it sends and the partial sum arriving (R = 2: no send overlaps an
// arrival), 2 kv each; dO and dq; and per tile the scores, p, dp, ds and a mask
// ([B, max(KV/U, 1), c, c]).
Footprint ringAttentionFootprint(const StepShape& s) {
  const double uQ = s.rows(s.heads * s.headDim), kvHeads = std::max(s.kvHeads / s.ulysses, 1.0);
  const double kv = s.batch * s.ulysses * s.tokens * kvHeads * s.headDim * 4;
  Footprint f;
  f.saved.add(2, uQ);
  f.saved.add(2, kv);
  f.saved.add(1, s.batch * s.heads * s.tokens * 4);
  f.work.add(s.ring > 2 ? 12 : 8, kv);
  f.work.add(2, uQ);
  f.work.add(5, s.batch * kvHeads * s.attentionTile * s.attentionTile * 4);
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
