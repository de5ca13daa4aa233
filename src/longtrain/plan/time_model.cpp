// The time model (time_model.h): the work of one step, priced by the measured rates. Non-obvious:
// communication that the program overlaps (ZeRO's gathers and reduce-scatters behind backward,
// the ring's K/V steps behind attention) costs only what its compute does not hide; Ulysses'
// all-to-alls sit on the critical path and cost in full. Across nodes, each collective is priced
// by where its group's ranks sit (collectiveSecondsPerByte, time_model.h).
#include "longtrain/plan/time_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "longtrain/config/parallel_layout.h"
#include "longtrain/config/validate.h"
#include "longtrain/plan/memory_model.h"

namespace lt::plan {

double collectiveSecondsPerByte(const std::vector<std::vector<int>>& groups, Pattern p, const Placement& at,
                                const Rates& r) {
  const int K = std::max(1, at.ranksPerNode);
  auto node = [K](int rank) { return rank / K; };
  std::vector<int> hops(static_cast<size_t>(at.world / K + 1), 0), senders(hops.size(), 0);
  auto spans = [&](const std::vector<int>& g) { return node(g.front()) != node(g.back()); };
  for (const auto& g : groups) {
    if (!spans(g)) continue;
    for (size_t i = 0; i < g.size(); ++i) {
      senders[node(g[i])] += 1;
      if (i == 0 || node(g[i]) != node(g[i - 1])) hops[node(g[i])] += 1;
    }
  }
  double worst = 0;
  for (const auto& g : groups) {
    if (g.size() < 2) continue;
    if (!spans(g) || r.linkSecondsPerByte <= 0) {
      worst = std::max(worst, r.commSecondsPerByte);
      continue;
    }
    for (int m : g) {
      if (p == Pattern::Ring) {
        worst = std::max({worst, r.commSecondsPerByte, r.linkSecondsPerByte * hops[node(m)]});
        continue;
      }
      const double off = static_cast<double>(std::count_if(g.begin(), g.end(), [&](int q) { return node(q) != node(m); })) /
                         static_cast<double>(g.size() - 1);
      worst = std::max({worst, (1 - off) * r.commSecondsPerByte, off * r.linkSecondsPerByte * senders[node(m)]});
    }
  }
  return worst;
}

namespace {

constexpr double kF = 4;  // bytes per fp32 element

// ATen ops a block runs (fused kernels), counted on the model's code: forward and backward.
constexpr double kOpsForwardPerBlock = 24, kOpsBackwardPerBlock = 48;
constexpr double kOpsPerLossChunk = 16, kOpsPerParameter = 3;  // the loss; Adam and zeroing

// Causal (query, key) pairs of a sequence of S tokens under a window W (0: none).
double causalPairs(double S, double W) {
  if (W <= 0 || W >= S) return S * (S + 1) / 2;
  return S * W - W * (W - 1) / 2;
}

// The footprints' step shape, and what the time model adds: tokens a rank holds over the
// micro-batch, layers, the window, the shard balance.
struct Shape : StepShape {
  double T = 0, L = 0, W = 0;
  bool zigzag = false;
};

Shape shapeOf(const config::Config& c) {
  Shape s;
  static_cast<StepShape&>(s) = stepShapeOf(c);
  s.T = s.batch * s.tokens;
  s.L = static_cast<double>(c.model.layers);
  s.W = static_cast<double>(c.model.slidingWindow);
  s.zigzag = config::layoutOf(c, c.sequenceParallelSize).zigzag;
  return s;
}

int64_t rows(double x) { return std::max<int64_t>(1, static_cast<int64_t>(std::llround(x))); }

// One block's linear layers over the rank's tokens: {forward, backward} seconds.
std::pair<double, double> blockLinears(const config::Config& c, const Shape& s, const Rates& r) {
  const int64_t T = rows(s.T), D = rows(s.hidden), I = rows(s.intermediate), qd = rows(s.heads * s.headDim), kvd = rows(s.kvHeads * s.headDim);
  double fwd = 0, bwd = 0;
  auto add = [&](int64_t M, int64_t N, int64_t K, double times) {
    fwd += times * r.linearForward(M, N, K);
    bwd += times * r.linearBackward(M, N, K);
  };
  if (c.model.fusedKernels) add(T, qd + 2 * kvd, D, 1);
  else {
    add(T, qd, D, 1);
    add(T, kvd, D, 2);
  }
  add(T, D, qd, 1);
  // The MLP, over ceil(S_rank / hidden) sequence shards when tiled (model/model.cpp).
  const double shards = c.model.tiledMlp ? std::max(1.0, std::ceil(s.tokens / s.hidden)) : 1;
  const int64_t M = rows(s.T / shards);
  if (c.model.fusedKernels) add(M, 2 * I, D, shards);
  else add(M, I, D, 2 * shards);
  add(M, D, I, shards);
  return {fwd, bwd};
}

// One block's attention core on this rank: {forward, backward} seconds. Ulysses gives the rank
// H / U heads of the whole sequence; the ring splits the (query, key) pairs over R ranks.
std::pair<double, double> blockAttention(const Shape& s, const Rates& r) {
  const double heads = s.heads / s.ulysses, kvHeads = std::max(1.0, s.kvHeads / s.ulysses);
  // Measured on at most 2048 tokens a sequence and 4096 over the batch, then scaled.
  const double measuredS = std::min(s.seq, 2048.0), measuredB = std::min(s.batch, std::max(1.0, std::floor(4096 / measuredS)));
  const double scale = causalPairs(s.seq, s.W) / causalPairs(measuredS, s.W > 0 ? std::min(s.W, measuredS) : 0) /
                       s.ring * s.batch / measuredB;
  // Contiguous ring shards: the last ring rank's queries see every key, the step waits for it.
  const double imbalance = s.ring > 1 && !s.zigzag ? 2.0 - 1.0 / s.ring : 1.0;
  const int64_t B0 = rows(measuredB), S0 = rows(measuredS), h = rows(heads), hk = rows(kvHeads), d = rows(s.headDim);
  return {scale * imbalance * r.attentionForward(B0, S0, h, hk, d),
          scale * imbalance * r.attentionBackward(B0, S0, h, hk, d)};
}

// A block's work outside its GEMMs and attention, per token, {forward, backward} seconds: one
// block timed on the model's code (Rates::block) less those two as priced at its shape. Timed on
// the rank's tokens, at most what ~32 MiB of activations hold (~4 bytes x (10 D + 3 qkv + 6 F)
// a token), so `train --fit` measures within its budget; and only while the block's weights and
// their gradients fit in 256 MiB (hidden ~1.5k): past that its GEMMs (D^2 a token) dwarf the
// rest (D a token), and the pieces price it. {-1, -1}: priced from the pieces.
std::pair<double, double> blockRestPerToken(const config::Config& c, const Shape& s, const Rates& r) {
  const double qkv = (s.heads + 2 * s.kvHeads) * s.headDim;
  const double weights = s.hidden * (qkv + s.heads * s.headDim + 3 * s.intermediate);
  if (!r.block || 2 * kF * weights > 256.0 * (1 << 20)) return {-1, -1};
  const double perToken = kF * (10 * s.hidden + 3 * qkv + 6 * s.intermediate);
  const double cap = std::clamp(std::floor((32 << 20) / perToken), 128.0, 4096.0);
  Shape m = s;
  m.tokens = std::min(s.tokens, cap);
  m.batch = std::min(s.batch, std::max(1.0, std::floor(cap / m.tokens)));
  m.T = m.batch * m.tokens;
  const int64_t B0 = rows(m.batch), S0 = rows(m.tokens);
  const auto [blockF, blockB] = r.block(c.model, B0, S0);
  const auto [linF, linB] = blockLinears(c, m, r);
  const int64_t h = rows(s.heads), hk = rows(s.kvHeads), d = rows(s.headDim);
  const double attF = r.attentionForward(B0, S0, h, hk, d), attB = r.attentionBackward(B0, S0, h, hk, d);
  return {std::max(0.0, blockF - linF - attF) / m.T, std::max(0.0, blockB - linB - attB) / m.T};
}

// Bytes a block's pointwise passes stream per token, forward (backward streams about twice it):
// two norms, the q/k/v split and RoPE, the attention's layout copies, SwiGLU, two residuals.
double pointwiseBytesPerToken(const Shape& s) {
  const double qkv = (s.heads + 2 * s.kvHeads) * s.headDim;
  return kF * (10 * s.hidden + 4 * qkv + 2 * s.heads * s.headDim + 3 * s.intermediate);
}

// The loss over the rank's tokens: its head products (gemm) and the softmax's passes (pointwise).
struct LossTime {
  double gemm = 0, pointwise = 0, bytes = 0;  // bytes: what the softmax's passes stream
};
LossTime lossTime(const Shape& s, const Rates& r, double* ops) {
  const double chunk = s.lossTile;
  const double chunks = std::ceil(s.tokens / chunk);  // each over the micro-batch's B sequences
  const int64_t M = rows(s.batch * chunk), V = rows(s.vocab), D = rows(s.hidden);
  *ops += chunks * kOpsPerLossChunk;
  const double bytes = s.T * s.vocab * kF * 4;  // logits: written, read by the softmax, its gradient written, read
  return {chunks * (r.linearForward(M, V, D) + r.linearBackward(M, V, D)),
          bytes * r.streamSecondsPerByte(s.batch * chunk * s.vocab * kF), bytes};
}

struct Comm {
  double exposed = 0, hidden = 0;  // seconds on the critical path; overlapped with backward
};

// Seconds on `at`'s links: exposed, a micro-step's Ulysses all-to-alls; hidden, an optimizer
// step's ring K/V steps (every micro-step's) and ZeRO's collectives.
Comm commSeconds(const config::Config& c, const Shape& s, const Placement& at, double recomputed, const Rates& r) {
  Comm b;
  const double passes = 2 + recomputed / std::max(1.0, s.L);  // forward, backward, recompute's forwards
  if (s.ulysses > 1)  // q, k, v in and the output back, each (U - 1) / U of the rank's tokens
    b.exposed += s.L * passes * s.T * ((s.heads + 2 * s.kvHeads) * s.headDim + s.heads * s.headDim) * kF *
                 (s.ulysses - 1) / s.ulysses * collectiveSecondsPerByte(c.layout.ulyssesGroups(), Pattern::AllToAll, at, r);
  if (s.ring > 1) {  // K and V one step round the ring R - 1 times; backward's dK/dV partials too
    const double kv = s.T * 2 * std::max(1.0, s.kvHeads / s.ulysses) * s.headDim * kF;
    b.hidden += static_cast<double>(c.gradAccum) * s.L * (passes + 1) * (s.ring - 1) * kv *
                collectiveSecondsPerByte(c.layout.ringGroups(), Pattern::Ring, at, r);  // every micro-step
  }
  const int world = at.world;
  if (world == 1) return b;
  const double n = static_cast<double>(c.model.numParams()) * kF;
  const double share = static_cast<double>(world - 1) / world;
  const double reduceBytes = c.precision.communication == config::CommDtype::Bf16 ? n / 2 : n;
  const double gatherBytes = c.precision.bf16 && c.precision.gathers ? n / 2 : n;
  const double accum = static_cast<double>(c.gradAccum);
  double bytes = 0;  // ZeRO's collectives span the world
  switch (c.zero.stage) {
    case 0: bytes = 2 * share * reduceBytes; break;  // one all-reduce at the step
    case 1: bytes = share * (reduceBytes + gatherBytes); break;
    case 2: bytes = share * (accum * reduceBytes + gatherBytes); break;
    default: bytes = accum * share * (reduceBytes + passes * gatherBytes); break;
  }
  std::vector<int> all(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) all[static_cast<size_t>(i)] = i;
  b.hidden += bytes * collectiveSecondsPerByte({all}, Pattern::Ring, at, r);
  return b;
}

}  // namespace

double tokensPerStep(const config::Config& c) {
  return static_cast<double>(c.trainBatchSize) * static_cast<double>(c.data.seqLen);
}

StepTime predictStepTime(const config::Config& c, const Placement& at, int graphBlocks, const Rates& r) {
  const int world = at.world;
  const Shape s = shapeOf(c);
  const double recomputed = std::max(0.0, s.L - graphBlocks);
  const double accum = static_cast<double>(c.gradAccum);
  StepTime t;
  if (c.model.attention != config::AttentionKernel::Fused)
    t.modelled = "attention \"" + std::string(config::optionName(c.model.attention)) +
                 "\" is priced as the fused kernel (only the fused kernel is measured)";
  const auto [linF, linB] = blockLinears(c, s, r);
  const auto [attF, attB] = blockAttention(s, r);
  t.gemm = s.L * (linF + linB) + recomputed * linF;  // per micro-step until multiplied by accum
  t.attention = s.L * (attF + attB) + recomputed * attF;
  const double pw = pointwiseBytesPerToken(s) * s.T * (3 * s.L + recomputed);
  const auto [restF, restB] = blockRestPerToken(c, s, r);
  double ops = 0;
  if (restF >= 0) {  // the rest of a block as timed on the model's code
    t.pointwise = s.T * ((s.L + recomputed) * restF + s.L * restB);
  } else {  // from its pieces: the passes' bytes and a count of ops
    ops = (s.L + recomputed) * kOpsForwardPerBlock + s.L * kOpsBackwardPerBlock;
    t.pointwise = pw * r.streamSecondsPerByte(s.T * s.hidden * kF);
  }
  const LossTime loss = lossTime(s, r, &ops);
  t.gemm += loss.gemm;
  t.pointwise += loss.pointwise;
  t.overhead = ops * r.opSeconds;
  // Under a budget tcmalloc decommits every freed span, so what a step writes faults in afresh:
  // half of what its pointwise passes and the loss stream (their outputs; measured with page-fault
  // counts on the e2e shapes: 93.5, 708 and 160 MiB a step against 91, 710 and 160 from this).
  if (decommitsFreedMemory(c, world, graphBlocks)) t.decommit = 0.5 * (pw + loss.bytes) * r.refaultSecondsPerByte;
  t.gemm *= accum;
  t.attention *= accum;
  t.pointwise *= accum;
  t.overhead *= accum;
  t.decommit *= accum;
  const double params = static_cast<double>(c.model.numParams());
  const double owned = c.zero.stage >= 1 ? params / world : params;
  t.optimizer = owned * r.adamSecondsPerElement + params * kF * 2 * r.streamSecondsPerByte(params * kF);
  t.overhead += (c.model.layers * 9 + 3) * kOpsPerParameter * r.opSeconds;
  const Comm b = commSeconds(c, s, at, recomputed, r);
  const double compute = t.gemm + t.attention + t.pointwise;
  const double overlapped = b.hidden, hideable = 2.0 / 3.0 * compute;
  t.comm = accum * b.exposed + std::max(0.0, overlapped - hideable);
  t.commHidden = std::min(overlapped, hideable);
  if (!c.train.offloadDir.empty() && r.diskSecondsPerByte > 0) {
    const double bytes = accum * 2 * recomputed * s.T * s.hidden * kF;  // kept inputs out, and back
    t.disk = std::max(0.0, bytes * r.diskSecondsPerByte - compute);
  }
  return t;
}

}  // namespace lt::plan
