// The memory model: it walks the step program the executor runs (compile::baseProgram with the
// run's passes) and, at each backward and loss instruction, sums what is held then: the model
// state, the kept block inputs and graphs, the gathered parameters and the instruction's own
// footprint, as the code that allocates declares it (footprint.h of kernels/, model/, sp/,
// compile/). Non-obvious: nothing here restates what a kernel saves; what is left is how the
// phases compose and what the allocator does with freed blocks. Arithmetic is in double.
#include "longtrain/plan/memory_model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <set>

#include "longtrain/compile/footprint.h"
#include "longtrain/compile/passes.h"
#include "longtrain/compile/schedule.h"
#include "longtrain/config/validate.h"
#include "longtrain/core/check.h"
#include "longtrain/core/cpu.h"
#include "longtrain/core/memory.h"
#include "longtrain/core/strings.h"
#include "longtrain/model/footprint.h"
#include "longtrain/model/model.h"
#include "longtrain/offload/footprint.h"
#include "longtrain/sp/footprint.h"
#include "longtrain/zero/footprint.h"

namespace lt::plan {

namespace {

constexpr double kF = 4;  // bytes per fp32 element
constexpr double kMiB = 1024.0 * 1024.0;

// Used only where no process has measured its baseline (setProcessBaseline): the algebra's
// unit tests. The last measurement on this build, for a record (tcmalloc, 1 rank, 1 thread: there
// the resident bytes are the start-up peak, train/process_baseline.h).
constexpr double kUnmeasuredResidentBytes = 185.5 * kMiB;
constexpr double kUnmeasuredStartupPeakBytes = 185.5 * kMiB;
constexpr double kUnmeasuredReleasedBytes = 174.2 * kMiB;
std::atomic<int64_t> gResident{0}, gStartupPeak{0}, gReleased{0};

// Allocator retention. glibc serves a block below its mmap threshold from its heap and
// keeps it after free; the threshold rises with use to at most 32 MiB, so blocks of 32 MiB
// and more are mmap'ed and returned on free. Hence RSS at its peak is about the largest
// (persistent + large blocks) of any phase plus the heap, which grows to the largest working
// set of small blocks of any phase (often another phase: the loss's logits against the
// heap left by attention's backward) and keeps a share more (fragmentation: the heap's
// holes). That share was fitted on bench/plan_accuracy.sh's configs (docs/performance.md). tcmalloc
// (what longtrain links) keeps freed spans in its page heap and serves later requests from them,
// returning little to the OS within a step: RSS at the peak is the measured resident baseline
// plus the largest live set of any phase (ProcessBaseline says which free memory is reused),
// plus one more of the peak phase's largest tensor. That last term is tcmalloc's fragmentation,
// measured (bench/heap_sampler.c's exact bytes in use against RSS, bench/plan_accuracy.sh's rows,
// docs/performance.md): at the peak the page heap holds free spans carved by smaller tensors
// out of the blocks the previous phases freed, none large enough for the phase's largest
// tensor, which is mapped anew: RSS exceeded baseline + bytes in use by 0.4 to 1.9 naive score
// blocks (rows 1-4, 8, 9, 18) and by one d(gate, up) at chunked attention's MLP (row 6). How
// many depends on where small tensors land, run to run (row 4 measured 1324 and 1758 MiB). Under
// a train.memory_budget tcmalloc decommits every freed span at once (core/memory.h), so RSS is
// the released baseline plus the bytes in use, with no fragment term: the mode the plan's
// guarantees (--max-seq, --fit, "auto") are made for, and the one bench/plan_accuracy.sh's
// BUDGET measures (rows 1-4, 8, 9, 18 under a budget: +4% to +21% with the fragment, -0.4% to
// +0.4% without).
constexpr double kMmapCeiling = 32 * kMiB;
constexpr double kHeapFragmentation = 0.8;

// Bytes of a phase's freed-each-step tensors, split by where glibc puts them.
struct Bytes {
  double small = 0, large = 0;  // tensors below / at or above kMmapCeiling
  double largeCount = 0;        // how many are large (nondecreasing in seq_len)
  double largest = 0;           // the largest single tensor (not scratch)
  void add(double count, double each) {
    if (count > 0) largest = std::max(largest, each);
    if (each >= kMmapCeiling) {
      large += count * each;
      largeCount += count;
    } else {
      small += count * each;
    }
  }
  void add(const TensorBytes& t) {
    for (const auto& term : t.terms) add(term.count, term.each);
  }
  // Scratch (core/footprint.h): counted, but not a candidate for `largest`'s fragment.
  void addScratch(const TensorBytes& t) {
    const double keep = largest;
    add(t);
    largest = keep;
  }
  double live() const { return small + large; }
};

// Parameter counts (elements) and the world.
struct Counts {
  double L = 0, W = 1, blockN = 0, embedN = 0, headN = 0, N = 0, maxParam = 0;
};

// From the keys, not c.layout: the ladder and the search change sequence_parallel_size (a
// world of P ranks is enough to split it; the split does not depend on the DP size).
config::ParallelLayout layoutOf(const config::Config& c) {
  return config::layoutOf(c, c.sequenceParallelSize);
}


Counts countsOf(const config::Config& c, int world) {
  const auto& m = c.model;
  Counts n;
  n.L = static_cast<double>(m.layers);
  n.W = world;
  n.blockN = static_cast<double>(m.blockParams());
  n.embedN = static_cast<double>(m.embedParams());
  n.headN = static_cast<double>(m.headParams());
  n.N = n.L * n.blockN + n.embedN + n.headN;
  n.maxParam = std::max(static_cast<double>(m.vocabSize * m.hidden), static_cast<double>(m.hidden * m.intermediate));
  return n;
}

struct Phase {
  double params = 0, grads = 0, optim = 0;  // held across steps
  Bytes acts, transient;                    // freed within the step
  double abovePeak = 0;  // tcmalloc: bytes mapped on top of the earlier phases' resident peak
  std::string name;
  double held() const { return params + grads + optim; }
  double live() const { return held() + acts.live() + transient.live(); }
};

// The quantities every phase shares.
struct StepTerms {
  StepShape s;
  Counts n;
  bool z3 = false, zero = false;
  double wireBytes = kF;  // ZeRO-3: bytes a block's or the head's element travels as (bf16 gathers: 2)
  // Stage 1 keeps gradients whole until the step's last micro-batch (with one micro-batch that
  // is every one: it then buckets like stage 2).
  bool accumulatesWhole = false;
  double uD = 0;      // [B, S/P, D]: one kept block input
  double batch = 0;   // batch tensors
  double sgFull = 0;  // full gradients that can wait in a ZeRO bucket
  double params = 0, grads = 0, optim = 0;  // persistent (modelState)
  Bytes block;         // one block's backward working set
  TensorBytes saved;   // what a kept graph holds
  Bytes loss;          // one loss tile's working set
  TensorBytes kept;    // buffers the model keeps from the first loss on (the fused head's)
  bool attnPeak = false;
};

// A block's backward (recompute or kept graph: the same working set) runs its halves in turn:
// the MLP's over everything the block saved, then the attention's over what attention saved.
// The executor holds the upstream gradient throughout (compile::executorWork).
void addBlockTerms(const config::Config& c, StepTerms& t) {
  const model::BlockFootprint b = model::blockFootprint(c.model, t.s, sp::attentionFootprint(c, t.s));
  const TensorBytes exec = compile::executorWork(compile::OpCode::RecomputeBackward, t.s);
  Bytes attn, mlp;
  for (Bytes* p : {&attn, &mlp}) {
    p->add(b.attention.saved);
    p->add(exec);
  }
  attn.add(b.attention.work);
  attn.addScratch(b.attention.scratch);
  mlp.add(b.mlp.saved);
  mlp.add(b.mlp.work);
  mlp.addScratch(b.mlp.scratch);
  t.attnPeak = attn.live() >= mlp.live();
  t.block = t.attnPeak ? attn : mlp;
  t.saved = b.saved();
}

void addLossTerms(const config::Config& c, StepTerms& t) {
  const Footprint f = model::headLossFootprint(c.model, t.s);
  t.loss.add(f.work);
  t.loss.addScratch(f.scratch);
  t.loss.add(compile::executorWork(compile::OpCode::LossAndGrad, t.s));
  t.kept.add(f.saved);
}

}  // namespace

StepShape stepShapeOf(const config::Config& c) {
  const auto& m = c.model;
  const config::ParallelLayout lay = layoutOf(c);
  StepShape s;
  s.batch = static_cast<double>(c.microBatch);
  s.seq = static_cast<double>(lay.paddedLength(c.data.seqLen));
  s.sp = c.sequenceParallelSize;
  s.ulysses = lay.U;
  s.ring = lay.R;
  s.tokens = s.seq / s.sp;
  s.hidden = static_cast<double>(m.hidden);
  s.heads = static_cast<double>(m.heads);
  s.kvHeads = static_cast<double>(m.kvHeads);
  s.headDim = static_cast<double>(m.headDim());
  s.intermediate = static_cast<double>(m.intermediate);
  s.vocab = static_cast<double>(m.vocabSize);
  s.attentionTile = static_cast<double>(m.attentionChunk > 0 ? m.attentionChunk : 256);
  s.attentionChunk = static_cast<double>(m.attentionChunk);
  s.attentionBf16 = model::attentionInBf16(m);
  s.threads = threadsPerRank(c.train.threads, c.train.nproc);
  s.lossTile = m.lossChunk > 0 ? std::min<double>(static_cast<double>(m.lossChunk), s.tokens) : s.tokens;
  return s;
}

ModelState modelState(const config::Config& c, int world) {
  const Counts d = countsOf(c, world);
  const int stage = c.zero.stage;
  const double share = stage >= 1 ? 1.0 / d.W : 1.0;  // masters, Adam states, gradient partitions
  double optim = 2 * d.N * kF * share;
  // Shadow master, m, v of the offloaded share, allocated by the first speculative Adam step
  // (ShardedOptimizer::stepSpeculative, CpuAdam::stepSpeculative) and kept. A sub-group is
  // stepped speculatively only when its gradients are handed over to a reduce
  // (ShardedOptimizer::handsOver): never at stage 0 on one rank (its world, SP included), whose
  // step runs Adam in place after validation and allocates no shadow (row 30 of
  // bench/plan_accuracy.sh: tcmalloc's allocated bytes are the same in both steps).
  const bool speculates = stage >= 1 || d.W > 1;
  if (c.zero.offloadOptimizer.superOffload && speculates)
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

void setProcessBaseline(const ProcessBaseline& b) {
  LT_ASSERT(b.resident > 0 && b.startupPeak > 0 && b.released > 0);
  gResident = b.resident;
  gStartupPeak = b.startupPeak;
  gReleased = b.released;
}

ProcessBaseline processBaseline() {
  if (gResident > 0) return {gResident, gStartupPeak, gReleased};
  return {static_cast<int64_t>(kUnmeasuredResidentBytes), static_cast<int64_t>(kUnmeasuredStartupPeakBytes),
          static_cast<int64_t>(kUnmeasuredReleasedBytes)};
}

namespace {

struct Prediction {
  MemoryBreakdown breakdown;
  bool decommit = false;  // the run decommits freed spans (decommitsFreedMemory)
  double largeCount = 0;  // tensors at or above the mmap ceiling, over all phases
  int offloaded = 0;      // block inputs the program writes to disk
};

StepTerms stepTerms(const config::Config& c, int world) {
  StepTerms t;
  t.s = stepShapeOf(c);
  t.n = countsOf(c, world);
  t.z3 = c.zero.stage == 3;
  if (t.z3 && c.model.resolved.bf16Gemms && c.precision.gathers) t.wireBytes = 2;
  t.zero = c.zero.stage >= 1;
  t.accumulatesWhole = c.zero.stage == 1 && c.gradAccum > 1;
  t.uD = t.s.rows(t.s.hidden);
  t.batch = compile::batchBytes(t.s);
  // Full gradients that can wait in a ZeRO bucket (IpgBuckets): the whole model when
  // sub_group_size >= N (the default 1e9), else about one sub-group.
  t.sgFull = std::min(t.n.N, static_cast<double>(c.zero.subGroupSize) + t.n.maxParam);
  const ModelState ms = modelState(c, world);
  t.params = static_cast<double>(ms.parameters);
  t.grads = static_cast<double>(ms.gradients);
  t.optim = static_cast<double>(ms.optimizer);
  addBlockTerms(c, t);
  addLossTerms(c, t);
  return t;
}

// The program a run executes without DeepCompile: the base with its fixed passes (zero3,
// free_activations, offload_activations), the same functions the engine calls.
compile::Program programOf(const config::Config& c, const Counts& n, int graphBlocks) {
  const int L = static_cast<int>(n.L);
  std::vector<int64_t> groupBytes(L, static_cast<int64_t>(n.blockN * kF));
  groupBytes.push_back(static_cast<int64_t>(n.headN * kF));
  groupBytes.push_back(static_cast<int64_t>(n.embedN * kF));
  const auto ctx = compile::PassContext::from(c, L, groupBytes);
  return compile::applyPasses(compile::baseProgram(L, graphBlocks), compile::fixedPasses(c), ctx);
}

// What the executor holds as it runs the program, instruction by instruction.
struct Walk {
  std::set<int> inputs;    // kept block inputs in memory: x_0 .. x_L
  int inFlight = -1;       // the input whose write to disk may still be running (until the loss ends)
  bool readAhead = false;  // an input is being read back during the next compute instruction
  std::set<int> graphs;    // blocks whose autograd graph is kept (ForwardGraph to Backward)
  std::set<int> gathered;  // parameter groups gathered (ZeRO-3)
  std::set<int> fetching;  // groups whose Prefetch may still run while compute goes on
  double gradsDone = 0;    // parameters whose gradients this micro-step has produced
  int offloaded = 0;
};

// Group k's ZeRO-3 gather while it runs (zero/footprint.h): blocks and the head travel at the
// matrices' width (their norms, a few vectors, counted alike), the embedding in fp32.
TensorBytes gatherWork(const StepTerms& t, int k) {
  const int L = static_cast<int>(t.n.L);
  const double wire = k < L ? t.n.blockN * t.wireBytes : k == L ? t.n.headN * t.wireBytes : t.n.embedN * kF;
  return zero::gatherFootprint(wire, t.n.W);
}

// The phase while instruction `op` of group `g` runs: what the walk holds, and its working set.
Phase phaseAt(const StepTerms& t, const Walk& w, compile::OpCode op, int g) {
  const Counts& n = t.n;
  const int L = static_cast<int>(n.L);
  const bool loss = op == compile::OpCode::LossAndGrad;
  Phase p;
  p.acts.add(static_cast<double>(w.inputs.size()) + (w.inFlight >= 0), t.uD);
  p.acts.add(1, t.batch);
  for (int k : w.graphs)
    if (loss || k != g) p.acts.add(t.saved);  // a Backward's own graph is its working set
  double gathered = 0;
  for (int k : w.gathered) gathered += k < L ? n.blockN : k == L ? n.headN : n.embedN;
  p.params = t.params + (t.z3 ? gathered * kF : 0);
  if (t.accumulatesWhole) p.grads = t.grads + n.N * kF;
  else if (t.zero) p.grads = t.grads + std::min(w.gradsDone, t.sgFull) * kF;  // full gradients waiting in buckets
  else p.grads = t.grads;  // stage 0: the parameters' gradients are views of one buffer, reduced in place
  p.optim = t.optim;
  p.transient = loss ? t.loss : t.block;
  if (w.inFlight >= 0 || w.readAhead) p.transient.add(offload::copyFootprint(t.uD));  // a copy's mapped chunk
  for (int k : w.fetching) p.transient.add(gatherWork(t, k));
  p.name = loss ? std::string(t.s.lossTile < t.s.tokens ? "loss (logits tiles)" : "loss (whole logits)")
                : "backward of block " + std::to_string(g) + (t.attnPeak ? " (attention)" : " (MLP)");
  return p;
}

// One phase per LossAndGrad, RecomputeBackward and Backward of the program; returns how many
// inputs it offloads.
int walkProgram(const compile::Program& prog, const StepTerms& t, std::vector<Phase>& phases) {
  using compile::OpCode;
  const int L = static_cast<int>(t.n.L);
  Walk w;
  for (const auto& in : prog.code) {
    const int g = in.group;
    switch (in.op) {
      case OpCode::Embed: w.inputs.insert(0); break;
      case OpCode::ForwardGraph: w.graphs.insert(g); [[fallthrough]];
      case OpCode::Forward: w.inputs.insert(g + 1); break;
      case OpCode::OffloadActivation:
        w.inputs.erase(g);
        w.inFlight = g;
        ++w.offloaded;
        break;
      case OpCode::ReloadActivation:
        w.inputs.insert(g);
        w.readAhead = true;
        break;
      case OpCode::Prefetch:
        w.gathered.insert(g);
        if (t.z3) w.fetching.insert(g);
        break;
      case OpCode::Gather:
        w.gathered.insert(g);
        if (t.z3 && !w.fetching.erase(g)) {  // a gather not prefetched: its collective runs now
          Phase p = phaseAt(t, w, in.op, g);
          p.transient = Bytes{};
          p.transient.add(gatherWork(t, g));
          p.name = "ZeRO-3 gather of group " + std::to_string(g);
          phases.push_back(p);
        }
        break;
      case OpCode::Release: w.gathered.erase(g); break;
      case OpCode::LossAndGrad:
        w.gradsDone += t.n.headN;
        phases.push_back(phaseAt(t, w, in.op, g));
        w.inputs.erase(L);  // the executor drops the final hidden state
        w.inFlight = -1;
        w.readAhead = false;
        break;
      case OpCode::RecomputeBackward:
      case OpCode::Backward:
        w.gradsDone += t.n.blockN;
        phases.push_back(phaseAt(t, w, in.op, g));
        w.graphs.erase(g);
        w.readAhead = false;
        break;
      case OpCode::FreeActivation: w.inputs.erase(g); break;
      case OpCode::EmbedBackward: w.gradsDone += t.n.embedN; break;
      default: break;  // ReduceGrads, OptimizerStep: the ZeRO and step phases below
    }
  }
  return w.offloaded;
}

// ZeRO stages 1-3: a bucket's reduce-scatter, the optimizer step and construction.
// `walkLargest`: the largest tensor the program's phases free (a span that size is free after them).
void addZeroPhases(const config::Config& c, const StepTerms& t, std::vector<Phase>& phases, double walkLargest) {
  const Counts& d = t.n;
  // Reduce-scatters still in flight when compute is short are not counted.
  const Footprint bucket =
      zero::bucketReduceFootprint(t.sgFull, static_cast<double>(c.zero.reduceBucketSize), d.maxParam, d.W);
  Phase p;
  p.params = t.params;
  p.grads = t.grads;
  p.transient.add(bucket.saved);
  p.transient.add(bucket.work);
  // It runs after the backward, on the pages the step's peak left, fragmented: a buffer larger
  // than any tensor the program freed finds no free span and is mapped on top (row 29: RSS grew
  // 4.5 MiB past the loss's peak there with 12 MiB fewer bytes in use, VmHWM 9.8).
  for (const auto& buffer : bucket.work.terms)
    if (buffer.each > walkLargest) p.abovePeak += buffer.count * buffer.each;
  p.optim = t.optim;
  p.acts.add(1, t.batch);
  p.name = "ZeRO gradient reduce-scatter";
  phases.push_back(p);
  Phase o;  // step(): the global norm allocates nothing (kernels::sumOfSquares);
  o.params = t.params;  // stages 1 and 2 then all-gather the masters, two runs in flight
  o.grads = t.grads;
  o.optim = t.optim;
  if (!t.z3) o.transient.add(zero::masterGatherFootprint(d.N, static_cast<double>(c.zero.allgatherBucketSize), d.maxParam));
  o.name = "optimizer step";
  phases.push_back(o);
  Phase i;  // construction: the whole model exists before the sharded optimizer partitions it
  i.params = t.z3 ? d.N * kF + t.params : t.params;
  i.grads = t.grads;
  i.optim = 2 * d.N * kF / d.W;
  i.name = "ZeRO construction";
  phases.push_back(i);
}

// Stage 0: the gradients are all-reduced in place; the norm and Adam allocate nothing.
Phase dataParallelStepPhase(const StepTerms& t) {
  Phase o;
  o.params = t.params;
  o.grads = t.grads;
  o.optim = t.optim;
  o.name = "optimizer step";
  return o;
}

// The peak over the phases: under tcmalloc the largest phase over the resident baseline (at least
// the start-up peak); under glibc
// the largest persistent + large-block set plus the heap (small blocks) and its fragmentation.
// `decommit`: tcmalloc returns each freed span at once (a train.memory_budget is set).
Prediction peakOf(const std::vector<Phase>& phases, bool decommit) {
  const Phase* top = &phases[0];
  double held = 0, small = 0, largeCount = 0;
  for (const auto& p : phases) {
    if (p.live() > top->live()) top = &p;
    held = std::max(held, p.held() + p.acts.large + p.transient.large);
    small = std::max(small, p.acts.small + p.transient.small);
    largeCount += p.acts.largeCount + p.transient.largeCount;
  }
  const bool tcmalloc = allocatorName() == "tcmalloc";
  decommit = decommit && tcmalloc;
  const ProcessBaseline pb = processBaseline();
  const double resident = static_cast<double>(decommit ? pb.released : pb.resident),
               startup = static_cast<double>(pb.startupPeak);
  // glibc: its heap is not measured free, so the start-up peak is the baseline.
  const double baseline = tcmalloc ? resident : startup;
  // tcmalloc: each phase needs its live bytes and its largest tensor's fragment, or the resident
  // peak of the phases before it plus what it maps on top (abovePeak).
  double need = 0, before = 0;
  if (tcmalloc) {
    for (const auto& p : phases) {
      const double n = decommit ? p.live()
                                : std::max(p.live() + p.transient.largest, p.abovePeak > 0 ? before + p.abovePeak : 0.0);
      if (n > need) need = n, top = &p;
      before = std::max(before, n);
    }
  }
  const double total = tcmalloc ? std::max(startup, resident + need) : baseline + held + (1 + kHeapFragmentation) * small;
  Prediction out;
  auto& m = out.breakdown;
  m.baseline = static_cast<int64_t>(baseline);
  m.parameters = static_cast<int64_t>(top->params);
  m.gradients = static_cast<int64_t>(top->grads);
  m.optimizer = static_cast<int64_t>(top->optim);
  m.activations = static_cast<int64_t>(top->acts.live());
  m.transient = static_cast<int64_t>(top->transient.live());
  // tcmalloc: the fragment of the peak phase's largest tensor, or start-up's free memory beyond
  // the live bytes; glibc: held + small >= every phase's live bytes. Either way >= 0.
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
  const int offloaded = walkProgram(programOf(c, t.n, graphBlocks), t, phases);
  double walkLargest = 0;
  for (const auto& p : phases) walkLargest = std::max(walkLargest, p.transient.largest);
  if (t.zero) addZeroPhases(c, t, phases, walkLargest);
  else phases.push_back(dataParallelStepPhase(t));
  for (auto& p : phases)  // kept from the first loss on: not yet at construction
    if (p.name != "ZeRO construction") p.acts.add(t.kept);
  // Decommit only where a budget is set and the peak kept without it is not well inside it.
  Prediction out = peakOf(phases, false);
  const double keepWithin = kKeepFreedShare * static_cast<double>(fitBytes(c.train.memoryBudget));
  if (c.train.memoryBudget > 0 && static_cast<double>(out.breakdown.total()) > keepWithin) {
    out = peakOf(phases, true);
    out.decommit = allocatorName() == "tcmalloc";
  }
  out.breakdown.offloaded = static_cast<int64_t>(offloaded * t.uD);
  return out;
}

}  // namespace

MemoryBreakdown predictPeak(const config::Config& c, int world, int graphBlocks) {
  LT_ASSERT(graphBlocks >= 0 && graphBlocks <= c.model.layers);
  return predict(c, world, graphBlocks).breakdown;
}

bool decommitsFreedMemory(const config::Config& c, int world, int graphBlocks) {
  return c.train.memoryBudget > 0 && predict(c, world, graphBlocks).decommit;
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
  while (k < L && predict(c, world, k + 1).breakdown.total() <= fitBytes(budgetBytes)) ++k;
  return k;
}

int64_t seqLenMultiple(const config::Config& c) { return layoutOf(c).unit(); }

int64_t minSeqLen(const config::Config& c) {
  if (c.data.type == config::DataType::KvRecall) return 1 + 2 * c.data.kvPairs + 2 * c.data.kvQueries;  // data.cpp's check
  return 2;
}

int64_t maxSeqLen(const config::Config& cfg, int world, int64_t budget, int64_t cap) {
  const int64_t budgetBytes = fitBytes(budget);
  const int64_t unit = seqLenMultiple(cfg);
  config::Config c = cfg;
  c.train.memoryBudget = budget;  // the run at this length sets it (plan prints the --set): decommitted
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
