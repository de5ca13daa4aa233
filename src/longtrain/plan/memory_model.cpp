// The memory model. Each term counts tensors the code holds, in units of one fp32 tensor of a
// given shape per rank; the derivation of each count is beside it. The step's phases (one
// block's recompute + backward for every block, the loss, the end of backward under ZeRO-3,
// the optimizer step, ZeRO-3's construction) are evaluated and the largest is the peak.
// Arithmetic is in double (a naive [B, H, S, S] at S = 2^24 overflows nothing in double).
#include "longtrain/plan/memory_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "longtrain/core/check.h"
#include "longtrain/core/memory.h"
#include "longtrain/core/strings.h"
#include "longtrain/config/validate.h"

namespace lt::plan {

namespace {

constexpr double kF = 4;  // bytes per fp32 element
constexpr double kMiB = 1024.0 * 1024.0;

// Process baseline: peak RSS of a 2-layer, hidden-32, 64-token run (0.04M parameters, so its
// tensors are < 1 MiB), measured with `longtrain train`: libtorch's code and data, OpenMP and
// Gloo threads, the allocator's own arenas. With glibc malloc: 167.8-169.2 MiB for 1, 2 and 4
// process ranks and 1 or 2 threads; with tcmalloc (what longtrain links): 185.9-186.9 MiB.
constexpr double kBaselineBytes = 168.5 * kMiB;
constexpr double kBaselineTcmallocBytes = 186.0 * kMiB;

// Allocator retention. glibc serves a block below its mmap threshold from its heap and
// keeps it after free; the threshold rises with use to at most 32 MiB, so blocks of 32 MiB
// and more are mmap'ed and returned on free. Hence RSS at its peak is about the largest
// (persistent + large blocks) of any phase plus the heap, which grows to the largest working
// set of small blocks of any phase (often another phase: the loss's logits against the
// heap left by attention's backward) and keeps a share more (fragmentation: the heap's
// holes). That share was fitted on bench/plan_accuracy.sh's configs (README, "plan
// accuracy"); with a fixed 1 MiB mmap threshold (MALLOC_MMAP_THRESHOLD_, little retention)
// the live bytes alone came within 1% and 5% of the measured peak on two of them. (That
// setting is not the default: it made chunked attention's steps 3x slower here.)
// tcmalloc keeps freed spans in its page heap and serves later requests from them, returning
// little to the OS within a step: RSS at the peak is the baseline plus the largest live set of
// any phase. Fitted on bench/plan_accuracy.sh's 13 configs: measured/predicted live bytes
// 0.92-1.16 with no retention term (README, "plan accuracy").
constexpr double kMmapCeiling = 32 * kMiB;
constexpr double kHeapFragmentation = 0.8;

// Bytes of a phase's freed-each-step tensors, split by where glibc puts them.
struct Bytes {
  double small = 0, large = 0;  // tensors below / at or above kMmapCeiling
  double largeCount = 0;        // how many are large (nondecreasing in seq_len)
  void add(double count, double each) {
    if (each >= kMmapCeiling) {
      large += count * each;
      largeCount += count;
    } else {
      small += count * each;
    }
  }
  void add(const Bytes& o) {
    small += o.small;
    large += o.large;
    largeCount += o.largeCount;
  }
  double live() const { return small + large; }
};

struct Dims {
  double B, S, P, s, D, H, KV, Dh, F, V, L, W;
  double U, R;      // the SP layout (sp/layout.h): Ulysses x ring; S is the padded length
  bool ring = false;  // the ring kernel is the attention core (R > 1 or zigzag)
  double blockN, embedN, headN, N, maxParam;
};

// From the keys, not c.layout: the ladder and the search change sequence_parallel_size (a
// world of P ranks is enough to split it; the split does not depend on the DP size).
config::ParallelLayout layoutOf(const config::Config& c) {
  return config::layoutOf(c, c.sequenceParallelSize);
}

Dims dimsOf(const config::Config& c, int world) {
  const auto& m = c.model;
  Dims d{};
  d.B = static_cast<double>(c.microBatch);
  const config::ParallelLayout lay = layoutOf(c);
  d.S = static_cast<double>(lay.paddedLength(c.data.seqLen));
  d.P = c.sequenceParallelSize;
  d.U = lay.U;
  d.R = lay.R;
  d.ring = !lay.ulyssesOnly();
  d.s = d.S / d.P;
  d.D = static_cast<double>(m.hidden);
  d.H = static_cast<double>(m.heads);
  d.KV = static_cast<double>(m.kvHeads);
  d.Dh = static_cast<double>(m.headDim());
  d.F = static_cast<double>(m.intermediate);
  d.V = static_cast<double>(m.vocabSize);
  d.L = static_cast<double>(m.layers);
  d.W = world;
  d.blockN = static_cast<double>(m.blockParams());
  d.embedN = static_cast<double>(m.embedParams());
  d.headN = static_cast<double>(m.headParams());
  d.N = d.L * d.blockN + d.embedN + d.headN;
  d.maxParam = std::max(d.V * d.D, d.D * d.F);
  return d;
}

struct Phase {
  double params = 0, grads = 0, optim = 0;  // held across steps
  Bytes acts, transient;                    // freed within the step
  std::string name;
  double held() const { return params + grads + optim; }
  double live() const { return held() + acts.live() + transient.live(); }
};

// One block's recompute (forward with grad) and backward, per rank. Units:
//   uD = [B, S/P, D]; uKV = [B, S/P, KV*Dh]; uF = [B, S/P, F];
//   uA = [B, H/P, S, S] (naive scores); uC = [B, H/P, c, c] (one chunked-attention tile).
// Under Ulysses the attention core holds [B, S, H/P, Dh] per rank: the same bytes as uD.
// Returns the larger of the MLP's and the attention's backward working sets; `saved` gets
// what a block that keeps its graph holds from its forward to its backward (beyond its input).
// The attention half: what autograd saves for it (`saved`) and what its backward adds (`work`).
void attentionCost(const config::Config& c, const Dims& d, Bytes& savedAttn, Bytes& attnWork) {
  const double uD = d.B * d.s * d.D * kF, uKV = d.B * d.s * d.KV * d.Dh * kF;
  // q, the attention's output and their gradients: [B, S/P, H x Dh], uD unless head_dim is given
  const double uQ = d.B * d.s * d.H * d.Dh * kF;
  const double hP = d.H / d.P;
  const bool fusedOps = c.model.fusedKernels;
  savedAttn.add(fusedOps ? 5 : 6, uD);
  savedAttn.add(fusedOps && c.model.attention == config::AttentionKernel::Fused ? 4 : 3, uKV);
  if (fusedOps) savedAttn.add(1, d.D * (d.H * d.Dh + 2 * d.KV * d.Dh) * kF);
  // Qwen3's q/k norms save their inputs (contiguous copies of the q and k columns); the ATen
  // composition saves about twice that. Biases are added in place of the GEMM's output: nothing.
  if (c.model.qkNorm) {
    savedAttn.add(fusedOps ? 1 : 2, uQ);
    savedAttn.add(fusedOps ? 1 : 2, uKV);
  }
  if (d.ring) {
    // RingFn (sp/ring_attention.cpp) is the core. Per rank it holds U s query tokens of H/U
    // heads (uD bytes) and U s tokens of max(KV/U, 1) kv heads (uKVr). It saves q grouped under
    // its kv head and its output (2 uD), the local k, v (2 uKVr) and the log-sum-exp; under
    // Ulysses the all-to-alls' outputs too (q, k, v). Backward: the ring's K/V gathered again
    // (2 R uKVr), dK/dV per source (2 R uKVr), the reduce-scatter's receive buffer (2 R uKVr),
    // dO, dq (2 uD) and per tile the scores, p, dp, ds and a mask (5 [B, KV, c, c]).
    const double ch = static_cast<double>(c.model.attentionChunk > 0 ? c.model.attentionChunk : 256);
    const double uKVr = d.B * d.U * d.s * std::max(d.KV / d.U, 1.0) * d.Dh * kF;
    savedAttn.add(2, uQ);
    savedAttn.add(2, uKVr);
    savedAttn.add(1, d.B * d.H / d.U * d.U * d.s * kF);
    if (d.U > 1) {
      savedAttn.add(1, uQ);
      savedAttn.add(2, uKVr);
    }
    attnWork.add(6 * d.R, uKVr);
    attnWork.add(2, uQ);
    attnWork.add(5, d.B * std::max(d.KV / d.U, 1.0) * ch * ch * kF);
  } else if (c.model.attention == config::AttentionKernel::Fused) {
    // FusedAttentionFn saves its inputs and output and the log-sum-exp ([B, H/P, S]). On one
    // rank the inputs are the rotations and v above and the output is o_proj's input; under
    // Ulysses they are the all-to-all's outputs, held only by the kernel (q, out: 2 uD; k, v with
    // max(KV/P, 1) heads). Backward: dq, dk, dv and the transposes kt, vt (1 uD + 4 uKV);
    // each thread's tiles are kilobytes.
    savedAttn.add(1, d.B * hP * d.S * kF);
    const double uKVh = d.B * d.S * std::max(d.KV / d.P, 1.0) * d.Dh * kF;
    if (d.P > 1) {
      savedAttn.add(2, uQ);
      savedAttn.add(2, uKVh);
    }
    attnWork.add(1, uQ);
    attnWork.add(4, d.P > 1 ? uKVh : uKV);
  } else if (c.model.attention == config::AttentionKernel::Chunked) {
    const double ch = std::min<double>(static_cast<double>(c.model.attentionChunk > 0 ? c.model.attentionChunk : 256), d.S);
    // ChunkedFn saves contiguous q, k, v ([B, H/P, S, Dh], KV expanded) and its output (4 uD)
    // and the log-sum-exp ([B, H/P, S]). Backward: dO made contiguous, dq, dk, dv (4 uD), and
    // per tile the scores, p, dp, ds and a temporary (5 uC).
    savedAttn.add(4, uQ);
    savedAttn.add(1, d.B * hP * d.S * kF);
    attnWork.add(4, uQ);
    attnWork.add(5, d.B * hP * ch * ch * kF);
  } else {
    const double uA = d.B * hP * d.S * d.S * kF;
    // causalAttention: matmul copies q and k^T into contiguous operands (saved by bmm: 2 uD),
    // softmax saves p (uA), p @ v saves its copy of v (uD); the causal mask [S, S] (bytes).
    // Backward at softmax: p, dP and dS coexist (+2 uA); dq, dk, dv (3 uD).
    savedAttn.add(3, uQ);
    savedAttn.add(1, uA);
    savedAttn.add(1, d.S * d.S);
    attnWork.add(2, uA);
    attnWork.add(3, uQ);
  }
  if (d.U > 1) attnWork.add(3, uQ);  // all-to-all backward: contiguous gradient, send, receive
}

// The MLP half, likewise.
void mlpCost(const config::Config& c, const Dims& d, Bytes& savedMlp, Bytes& mlpWork) {
  const double uD = d.B * d.s * d.D * kF, uF = d.B * d.s * d.F * kF;
  const bool fusedOps = c.model.fusedKernels;
  // MLP half: rmsNorm (2 uD); untiled SwiGLU saves gate(x), silu(gate), up(x) and their
  // product (4 uF); TiledMLP saves only its input (already counted as m).
  // Fused: the norm saves 1 uD; the gate/up GEMM's output [B, S/P, 2F] is what the fused
  // SwiGLU saves, its product (uF) is saved by down_proj, and [wGate; wUp] by the GEMM.
  // The bf16 GEMM route (bf16.enabled, when the engine chose it) with fused ops: the GEMMs save
  // bf16 copies of their inputs, so the normed inputs of q/k/v and gate/up halve (-1 uD) while
  // o_proj adds a half-size copy of the attention output that the kernel keeps in fp32
  // (+0.5 uD); SwiGLU saves gu as bf16 (2 -> 1 uF) and down_proj its input (1 -> 0.5 uF).
  // TiledMLP saves its fp32 input itself: only the attention half's -0.5 + 0.5 uD, i.e. nothing.
  const bool bf16 = c.model.resolved.bf16Gemms && fusedOps;
  savedMlp.add(fusedOps ? (bf16 && !c.model.tiledMlp ? 0.5 : 1) : 2, uD);
  if (fusedOps) savedMlp.add(2, d.D * d.F * kF);
  if (c.model.tiledMlp) {
    // TiledMlpFn::backward: dx (uD), zeroed weight-gradient accumulators and one shard's
    // weight gradients (6 x D x F), one shard's recompute and its gradients (~7 [B, len, F],
    // len = ceil(S/P / shards) <= hidden).
    const double len = std::min(d.s, d.D);
    mlpWork.add(1, uD);
    mlpWork.add(6, d.D * d.F * kF);
    mlpWork.add(7, d.B * len * d.F * kF);
  } else {
    // d(product), d(silu), d(up) coexist at the mul's backward (3 uF), then dm (uD); fused:
    // d(product) and d(gate, up) (3 uF).
    savedMlp.add(fusedOps ? (bf16 ? 1.5 : 3) : 4, uF);
    mlpWork.add(bf16 ? 4 : 3, uF);  // bf16: the gate/up GEMM's backward rounds d(gate, up) (+1 uF)
    mlpWork.add(1, uD);
  }
}

Bytes blockCost(const config::Config& c, const Dims& d, bool* attnPeak, Bytes* saved) {
  const double uD = d.B * d.s * d.D * kF;
  Bytes savedAttn, attnWork, savedMlp, mlpWork;
  attentionCost(c, d, savedAttn, attnWork);
  mlpCost(c, d, savedMlp, mlpWork);
  // The executor holds the block's output y and the upstream gradient (2 uD) throughout.
  Bytes mlpPhase, attnPhase;
  mlpPhase.add(savedAttn);
  mlpPhase.add(savedMlp);
  mlpPhase.add(2, uD);
  mlpPhase.add(mlpWork);
  attnPhase.add(savedAttn);
  attnPhase.add(3, uD);  // y, the upstream gradient, d(x1)
  attnPhase.add(attnWork);
  *attnPeak = attnPhase.live() >= mlpPhase.live();
  *saved = savedAttn;
  saved->add(savedMlp);
  return *attnPeak ? attnPhase : mlpPhase;
}

// The loss phase (Executor::lossAndGrad): per tile of cl tokens, logits [B, cl, V] are freed
// when lossSum returns, but log_softmax saves its output; backward holds it with nll's
// gradient and log_softmax's (3 [B, cl, V]); the final norm's saved tensors and dh (3
// [B, cl, D]); the LM head's weight-gradient temporary (V x D); tiled: gradH (uD). With
// model.fused_kernels the head is fused with the loss (Model::headLoss): one [B, cl, V]
// buffer holds the logits, then the probabilities, then their gradient, and the model keeps
// it from step to step, so predict() counts it in every phase after construction.
// Tokens per sequence in one loss tile (Executor::lossTile).
double lossTileTokens(const config::Config& c, const Dims& d) {
  return c.model.lossChunk > 0 ? std::min<double>(static_cast<double>(c.model.lossChunk), d.s) : d.s;
}

Bytes lossCost(const config::Config& c, const Dims& d) {
  const double cl = lossTileTokens(c, d);
  Bytes t;
  if (!c.model.fusedKernels) t.add(3, d.B * cl * d.V * kF);  // fused: Model::headLoss's kept buffer (predict)
  t.add(3, d.B * cl * d.D * kF);
  t.add(1, d.V * d.D * kF);
  if (cl < d.s) t.add(1, d.B * d.s * d.D * kF);
  return t;
}

}  // namespace

ModelState modelState(const config::Config& c, int world) {
  const Dims d = dimsOf(c, world);
  const int stage = c.zero.stage;
  const double share = stage >= 1 ? 1.0 / d.W : 1.0;  // masters, Adam states, gradient partitions
  double optim = 2 * d.N * kF * share;
  if (c.zero.offloadOptimizer.superOffload)  // shadow master, m, v of the offloaded share
    optim += c.zero.offloadOptimizer.ratio * 3 * d.N * kF * share;
  ModelState m;
  // Stages 1 and 2 keep the full parameters beside the masters; stage 3 keeps only its masters.
  m.parameters = static_cast<int64_t>(d.N * kF * (stage == 0 ? 1 : stage == 3 ? share : 1 + share));
  // bf16 gathers: the bf16 copies CPU Adam writes beside the masters (every sub-group with a
  // matrix in it: all of the model at the default sub_group_size).
  if (stage >= 1 && c.model.resolved.bf16Gemms && c.precision.gathers) m.parameters += static_cast<int64_t>(d.N * 2 * share);
  // The gradient partitions (stage 0: the whole gradients); full gradients on their way to a
  // reduce-scatter are counted by phase (predict).
  m.gradients = static_cast<int64_t>(d.N * kF * share);
  m.optimizer = static_cast<int64_t>(optim);
  return m;
}

namespace {

struct Prediction {
  MemoryBreakdown breakdown;
  double largeCount = 0;  // tensors at or above the mmap ceiling, over all phases
};

// The quantities every phase shares.
struct StepTerms {
  Dims d;
  bool z3 = false, zero = false;
  // Stage 1 keeps gradients whole until the step's last micro-batch (with one micro-batch that
  // is every one: it then buckets like stage 2).
  bool accumulatesWhole = false;
  double uD = 0;      // [B, S/P, D]
  double batch = 0;   // batch tensors
  double sgFull = 0;  // full gradients that can wait in a ZeRO bucket
  double params = 0, grads = 0, optim = 0;  // persistent (modelState)
  Bytes block, saved;  // one block's recompute + backward; what a kept graph holds
  bool attnPeak = false;
  bool offloadToDisk = false;  // train.offload_dir
};

// train.offload_dir: the inputs of the recomputed blocks but the last (0..n-1) go to disk
// (compile/passes.cpp offload_activations).
int offloadedInputs(const StepTerms& t, int graphBlocks) {
  return t.offloadToDisk ? std::max(0, static_cast<int>(t.d.L) - graphBlocks - 1) : 0;
}

StepTerms stepTerms(const config::Config& c, int world) {
  StepTerms t;
  t.d = dimsOf(c, world);
  const Dims& d = t.d;
  t.z3 = c.zero.stage == 3;
  t.zero = c.zero.stage >= 1;
  t.accumulatesWhole = c.zero.stage == 1 && c.gradAccum > 1;
  t.offloadToDisk = !c.train.offloadDir.empty();
  t.uD = d.B * d.s * d.D * kF;
  // Batch tensors: ids, labels, positions, shift_labels as int64 (the Ulysses loader
  // all-gathers the P batches and queues P shards: the same total), plus kv_recall's
  // samples as vectors while collating.
  t.batch = 48 * d.B * d.S;
  // Full gradients that can wait in a ZeRO bucket (IpgBuckets): the whole model when
  // sub_group_size >= N (the default 1e9), else about one sub-group.
  t.sgFull = std::min(d.N, static_cast<double>(c.zero.subGroupSize) + d.maxParam);
  const ModelState ms = modelState(c, world);
  t.params = static_cast<double>(ms.parameters);
  t.grads = static_cast<double>(ms.gradients);
  t.optim = static_cast<double>(ms.optimizer);
  t.block = blockCost(c, d, &t.attnPeak, &t.saved);
  return t;
}

// The backward of each block b (its recompute, or its kept graph: the same working set):
// inputs of blocks 0..b are still kept (free_activations frees b after), and so are the graphs
// of the blocks before b that keep theirs (under ZeRO-3 with their parameters gathered).
void addBackwardPhases(const StepTerms& t, int graphBlocks, std::vector<Phase>& phases) {
  const Dims& d = t.d;
  const int L = static_cast<int>(d.L), firstGraph = L - graphBlocks;
  // With offload to disk, in memory in the backward of block b are the inputs not offloaded,
  // b's own (taken back) and the one read ahead for b - 1.
  const int off = offloadedInputs(t, graphBlocks);
  auto inputsInMemory = [&](int b) { return b + 1 - std::min(b + 1, off) + (b < off) + (b >= 1 && b - 1 < off); };
  for (int b = L - 1; b >= 0; --b) {
    const int graphsBefore = std::max(0, b - firstGraph);
    Phase p;
    p.acts.add(inputsInMemory(b), t.uD);
    p.acts.add(1, t.batch);
    for (int k = 0; k < graphsBefore; ++k) p.acts.add(t.saved);
    p.params = t.params + (t.z3 ? (1 + graphsBefore) * d.blockN * kF : 0);  // ZeRO-3: block b gathered
    const double done = d.headN + (d.L - b) * d.blockN;  // gradients produced so far this step
    if (t.accumulatesWhole) p.grads = t.grads + d.N * kF;
    else if (t.zero) p.grads = t.grads + std::min(done, t.sgFull) * kF;  // full gradients waiting in buckets
    else p.grads = t.grads;  // stage 0: the parameters' gradients are views of one buffer, reduced in place
    p.optim = t.optim;
    p.transient = t.block;
    p.name = "backward of block " + std::to_string(b) + (t.attnPeak ? " (attention)" : " (MLP)");
    phases.push_back(p);
  }
}

// LossAndGrad: every block input (but those on disk, of which one write may still be in
// flight), the final hidden state and the kept graphs.
Phase lossPhase(const config::Config& c, const StepTerms& t, int graphBlocks) {
  const Dims& d = t.d;
  const int off = offloadedInputs(t, graphBlocks);
  Phase p;
  p.acts.add(d.L + 1 - off + (off > 0), t.uD);
  p.acts.add(1, t.batch);
  for (int k = 0; k < graphBlocks; ++k) p.acts.add(t.saved);
  p.params = t.params + (t.z3 ? (d.headN + graphBlocks * d.blockN) * kF : 0);
  p.grads = t.grads + (t.accumulatesWhole ? d.N * kF : t.zero ? std::min(d.headN, t.sgFull) * kF : 0);
  p.optim = t.optim;
  p.transient = lossCost(c, d);
  p.name = c.model.lossChunk > 0 ? "loss (logits tiles)" : "loss (whole logits)";
  return p;
}

// ZeRO stages 1-3: a bucket's reduce-scatter, the optimizer step and construction.
void addZeroPhases(const config::Config& c, const StepTerms& t, std::vector<Phase>& phases) {
  const Dims& d = t.d;
  // A bucket completes (ShardedOptimizer::onBucket): its full gradients, a piece's [W, run] send
  // buffer (at most reduce_bucket_size elements), one padded gradient, and (W > 1) the
  // all-to-all's receive buffer (Comm::reduceScatter). Reduce-scatters still in flight when
  // compute is short are not counted.
  const double piece = std::min(t.sgFull, std::max(static_cast<double>(c.zero.reduceBucketSize), d.maxParam));
  Phase p;
  p.params = t.params;
  p.grads = t.grads;
  p.transient.add(1, t.sgFull * kF);
  p.transient.add(d.W > 1 ? 2 : 1, piece * kF);
  p.transient.add(1, d.maxParam * kF);
  p.optim = t.optim;
  p.acts.add(1, t.batch);
  p.name = "ZeRO gradient reduce-scatter";
  phases.push_back(p);
  Phase o;  // step(): the global norm reads each sub-group's gradient as float64, squared;
  o.params = t.params;  // stages 1 and 2 then all-gather the masters, two runs in flight
  o.grads = t.grads;
  o.optim = t.optim;
  o.transient.add(2, 8 * t.sgFull / d.W);
  if (!t.z3)
    o.transient.add(2, std::min(d.N, std::max(static_cast<double>(c.zero.allgatherBucketSize), d.maxParam)) * kF);
  o.name = "optimizer step";
  phases.push_back(o);
  Phase i;  // construction: the whole model exists before the sharded optimizer partitions it
  i.params = t.z3 ? d.N * kF + t.params : t.params;
  i.grads = t.grads;
  i.optim = 2 * d.N * kF / d.W;
  i.name = "ZeRO construction";
  phases.push_back(i);
}

// Stage 0: the gradients are all-reduced in place; the norm is float64, squared.
Phase dataParallelStepPhase(const StepTerms& t) {
  Phase o;
  o.params = t.params;
  o.grads = t.grads;
  o.optim = t.optim;
  o.transient.add(2, 8 * t.d.maxParam);
  o.name = "optimizer step";
  return o;
}

// The peak over the phases: under tcmalloc the largest phase over the baseline; under glibc
// the largest persistent + large-block set plus the heap (small blocks) and its fragmentation.
Prediction peakOf(const std::vector<Phase>& phases) {
  const Phase* top = &phases[0];
  double held = 0, small = 0, largeCount = 0;
  for (const auto& p : phases) {
    if (p.live() > top->live()) top = &p;
    held = std::max(held, p.held() + p.acts.large + p.transient.large);
    small = std::max(small, p.acts.small + p.transient.small);
    largeCount += p.acts.largeCount + p.transient.largeCount;
  }
  const bool tcmalloc = allocatorName() == "tcmalloc";
  const double baseline = tcmalloc ? kBaselineTcmallocBytes : kBaselineBytes;
  const double total = tcmalloc ? baseline + top->live() : baseline + held + (1 + kHeapFragmentation) * small;
  Prediction out;
  auto& m = out.breakdown;
  m.baseline = static_cast<int64_t>(baseline);
  m.parameters = static_cast<int64_t>(top->params);
  m.gradients = static_cast<int64_t>(top->grads);
  m.optimizer = static_cast<int64_t>(top->optim);
  m.activations = static_cast<int64_t>(top->acts.live());
  m.transient = static_cast<int64_t>(top->transient.live());
  // held + small >= every phase's live bytes, so this is >= 0.
  m.retained = std::max<int64_t>(0, static_cast<int64_t>(total) - m.baseline - static_cast<int64_t>(top->live()));
  m.phase = top->name;
  out.largeCount = largeCount;
  return out;
}

// `graphBlocks`: how many of the last blocks keep their autograd graph (no recompute).
Prediction predict(const config::Config& c, int world, int graphBlocks) {
  LT_CHECK(world >= 1 && world % c.sequenceParallelSize == 0, "plan: world size ", world,
           " is not a multiple of sequence_parallel_size=", c.sequenceParallelSize);
  const StepTerms t = stepTerms(c, world);
  std::vector<Phase> phases;
  addBackwardPhases(t, graphBlocks, phases);
  phases.push_back(lossPhase(c, t, graphBlocks));
  if (t.zero) addZeroPhases(c, t, phases);
  else phases.push_back(dataParallelStepPhase(t));
  if (c.model.fusedKernels) {  // Model::headLoss's buffer, kept from the first loss on
    const Dims& d = t.d;
    const double cl = lossTileTokens(c, d);
    for (auto& p : phases)
      if (p.name != "ZeRO construction") p.acts.add(1, d.B * cl * d.V * kF);
  }
  Prediction out = peakOf(phases);
  out.breakdown.offloaded = static_cast<int64_t>(offloadedInputs(t, graphBlocks) * t.uD);
  return out;
}

}  // namespace

MemoryBreakdown predictPeak(const config::Config& c, int world, int graphBlocks) {
  LT_ASSERT(graphBlocks >= 0 && graphBlocks <= c.model.layers);
  return predict(c, world, graphBlocks).breakdown;
}

int64_t memoryBudgetFor(const config::Config& c, int localRanks) {
  if (c.train.memoryBudget > 0) return c.train.memoryBudget;
  const int64_t limit = rankMemoryLimitBytes(localRanks);
  return limit < 0 ? 0 : static_cast<int64_t>(0.9 * static_cast<double>(limit));
}

int graphBlocksFor(const config::Config& c, int world, int64_t budgetBytes) {
  const int L = static_cast<int>(c.model.layers);
  if (c.activationCheckpointing == config::Recompute::All) return 0;
  if (c.activationCheckpointing == config::Recompute::None) return L;
  LT_ASSERT(c.activationCheckpointing == config::Recompute::Auto);
  int k = 0;  // the peak grows with k: take the largest that fits (0 when none does)
  while (k < L && predict(c, world, k + 1).breakdown.total() <= budgetBytes) ++k;
  return k;
}

int64_t seqLenMultiple(const config::Config& c) { return layoutOf(c).unit(); }

int64_t minSeqLen(const config::Config& c) {
  if (c.data.type == config::DataType::KvRecall) return 1 + 2 * c.data.kvPairs + 2 * c.data.kvQueries;  // data.cpp's check
  return 2;
}

int64_t maxSeqLen(const config::Config& cfg, int world, int64_t budgetBytes, int64_t cap) {
  const int64_t unit = seqLenMultiple(cfg);
  config::Config c = cfg;
  // "auto" recomputes every block at the longest length that fits; "none" never does.
  const int graphs = cfg.activationCheckpointing == config::Recompute::None ? static_cast<int>(cfg.model.layers) : 0;
  auto at = [&](int64_t k) {  // k units of seq_len
    c.data.seqLen = k * unit;
    return predict(c, world, graphs);
  };
  const int64_t first = (minSeqLen(cfg) + unit - 1) / unit;  // the shortest valid length, in units
  const int64_t maxK = std::max(first, cap / unit);
  // The prediction rises with seq_len except where a tensor grows past the mmap ceiling (it
  // leaves the heap, and its retention with it). Search the running maximum instead, so the
  // answer is monotone in the budget and every shorter length fits too: find where the count
  // of large tensors steps (bisection), and take the prediction just before each step.
  std::vector<std::pair<int64_t, double>> dips;  // (k where the count steps, prediction at k - 1)
  auto findSteps = [&](auto&& self, int64_t lo, double nLo, int64_t hi, double nHi) -> void {
    if (nLo == nHi) return;
    if (hi - lo == 1) {
      dips.emplace_back(hi, static_cast<double>(at(lo).breakdown.total()));
      return;
    }
    const int64_t mid = lo + (hi - lo) / 2;
    const double nMid = at(mid).largeCount;
    self(self, lo, nLo, mid, nMid);
    self(self, mid, nMid, hi, nHi);
  };
  findSteps(findSteps, first, at(first).largeCount, maxK + 1, at(maxK + 1).largeCount);
  auto fits = [&](int64_t k) {
    if (static_cast<double>(at(k).breakdown.total()) > static_cast<double>(budgetBytes)) return false;
    for (const auto& [step, before] : dips)
      if (step <= k && before > static_cast<double>(budgetBytes)) return false;
    return true;
  };
  if (!fits(first)) return 0;
  // Invariant: lo fits; hi does not (or hi = maxK + 1, past the cap).
  int64_t lo = first, hi = first + 1;
  while (hi <= maxK && fits(hi)) {
    lo = hi;
    hi = std::min(maxK + 1, lo * 2);
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid;
  }
  return lo * unit;
}

int64_t parseBytes(const std::string& text) { return parseByteSize(text, "--max-seq"); }

std::vector<Rung> ablationLadder(const config::Config& base) {
  const int64_t lossChunk = base.model.lossChunk > 0 ? base.model.lossChunk : 256;
  std::vector<Rung> out;
  Rung r;
  r.cfg = base;
  r.cfg.model.attention = config::AttentionKernel::Naive;
  r.cfg.model.lossChunk = 0;
  r.cfg.model.tiledMlp = false;
  r.cfg.sequenceParallelSize = 1;
  r.cfg.sequenceParallelRingDegree = 0;  // each rung's layout is chosen from its P and the heads
  r.cfg.zero = config::ZeroConfig{};
  r.cfg.zero.subGroupSize = base.zero.subGroupSize;
  r.world = 1;
  r.name = "1 baseline";
  r.sets = {"model.attention=naive", "model.loss_chunk=0", "model.tiled_mlp=false", "sequence_parallel_size=1",
            "zero_optimization.stage=0"};
  out.push_back(r);
  r.name = "2 + tiled logits-loss";
  r.cfg.model.lossChunk = lossChunk;
  r.sets[1] = "model.loss_chunk=" + std::to_string(lossChunk);
  out.push_back(r);
  r.name = "3 + fused attention";
  r.cfg.model.attention = config::AttentionKernel::Fused;
  r.sets[0] = "model.attention=fused";
  out.push_back(r);
  r.name = "4 + tiled MLP";
  r.cfg.model.tiledMlp = true;
  r.sets[2] = "model.tiled_mlp=true";
  out.push_back(r);
  for (int P : {2, 4}) {
    r.name = std::string(P == 2 ? "5" : "6") + " + SP=" + std::to_string(P);
    r.cfg.sequenceParallelSize = P;
    r.world = P;
    r.sets[3] = "sequence_parallel_size=" + std::to_string(P);
    r.cfg.layout = layoutOf(r.cfg);  // beyond the head count: Ulysses x ring
    out.push_back(r);
  }
  r.name = "7 + ZeRO-3 + SuperOffload";
  r.cfg.zero.stage = 3;
  r.cfg.zero.offloadOptimizer.device = config::OffloadDevice::Cpu;
  r.cfg.zero.offloadOptimizer.superOffload = true;
  r.sets[4] = "zero_optimization.stage=3";
  r.sets.push_back("zero_optimization.offload_optimizer.device=cpu");
  r.sets.push_back("zero_optimization.offload_optimizer.super_offload=true");
  out.push_back(r);
  // Beyond the head count (DeepSpeed's Ulysses stops at it): twice the heads, at least SP 8.
  const int beyond = static_cast<int>(2 * std::max<int64_t>(4, base.model.heads));
  r.cfg.sequenceParallelSize = beyond;
  r.cfg.layout = layoutOf(r.cfg);
  r.world = beyond;
  r.name = "8 + SP=" + std::to_string(beyond) + " (" + std::to_string(r.cfg.layout.U) + "x" +
           std::to_string(r.cfg.layout.R) + " ring)";
  r.sets[3] = "sequence_parallel_size=" + std::to_string(beyond);
  out.push_back(r);
  return out;
}

}  // namespace lt::plan
