// The memory model behind `longtrain plan`: each rank's peak resident bytes for a config, and
// the longest seq_len that fits a per-rank budget. The plan walks the step program the executor
// runs and sums the footprints the allocating code declares (core/footprint.h); the process
// baseline is measured by the process that plans (setProcessBaseline). The peak is the largest
// of the step's phases (its breakdown is that phase's) plus what the allocator keeps of freed
// blocks: under glibc malloc a calibrated share; under tcmalloc, which longtrain links, one of
// the peak phase's largest tensor (its free spans are fragments too small for it, measured),
// except under a train.memory_budget, where tcmalloc returns freed spans at once and keeps none.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "longtrain/config/parse.h"
#include "longtrain/core/footprint.h"

namespace lt::plan {

// Bytes one rank holds at its predicted peak, by kind. total() is their sum.
struct MemoryBreakdown {
  int64_t baseline = 0;     // process: libtorch, thread pools, allocator (ProcessBaseline::resident)
  int64_t parameters = 0;   // fp32 parameters (ZeRO-3: master partition + gathered groups)
  int64_t gradients = 0;    // fp32 gradients (ZeRO-3: partition + full gradients waiting in buckets)
  int64_t optimizer = 0;    // Adam m and v (ZeRO-3: partitions, + SuperOffload rollback shadows)
  int64_t activations = 0;  // kept block inputs [B, S/P, D] (+ the batch)
  int64_t transient = 0;    // the phase's working set: one block's recompute + backward, or the loss
  int64_t retained = 0;     // free memory the allocator keeps: the fragment of the peak phase's
                            // largest tensor or start-up's beyond this step's live bytes
                            // (tcmalloc), or a share of the largest heap working set (glibc)
  std::string phase;        // which phase is the peak, e.g. "backward of block 1 (attention)"
  int64_t offloaded = 0;    // kept block inputs in train.offload_dir's file: on disk, not in total()
  int64_t total() const { return baseline + parameters + gradients + optimizer + activations + transient + retained; }
};

// The process baseline, measured by the process that plans (train/process_baseline.h).
// `resident`: this binary's resident bytes that no tensor reuses, once a run has started (libtorch,
// thread pools, the allocator's fragments, a process group); `startupPeak`: the peak RSS of a run
// whose tensors are < 1 MiB. A step peaks at the larger of startupPeak and resident + its live
// bytes. `released`: the resident bytes once tcmalloc has returned that run's free pages (a run
// under train.memory_budget decommits them at start-up, core/memory.h). Where nothing set them
// (unit tests of the algebra), the last measurement on this build stands in.
struct ProcessBaseline {
  int64_t resident = 0, startupPeak = 0, released = 0;
};
void setProcessBaseline(const ProcessBaseline& b);
ProcessBaseline processBaseline();

// The shapes one micro-step of `cfg` works on (the units the footprints count in).
StepShape stepShapeOf(const config::Config& cfg);

// Per-rank prediction for `cfg` with `world` ranks (data-parallel size = world / SP), when
// the last `graphBlocks` blocks keep their autograd graph and the others are recomputed.
MemoryBreakdown predictPeak(const config::Config& cfg, int world, int graphBlocks = 0);

// What every choice against a budget keeps free of it (activation_checkpointing "auto", "auto"
// tiling, --max-seq, --fit): the memory model's accuracy target. A prediction fits `budgetBytes`
// when it is within fitBytes(budgetBytes), so train and plan choose alike from the user's budget.
constexpr double kFitMargin = 0.03;
inline int64_t fitBytes(int64_t budgetBytes) {
  return static_cast<int64_t>((1 - kFitMargin) * static_cast<double>(budgetBytes));
}
// fitBytes' inverse: the least budget a predicted peak of `peakBytes` fits.
inline int64_t leastBudgetFitting(int64_t peakBytes) {
  auto b = static_cast<int64_t>(static_cast<double>(peakBytes) / (1 - kFitMargin));
  while (fitBytes(b) < peakBytes) ++b;
  while (fitBytes(b - 1) >= peakBytes) --b;
  return b;
}

// activation_checkpointing's choice: how many of the last blocks keep their graph. "all": 0;
// "none": every block; "auto": the most whose predicted peak fits `budgetBytes` (0 when even
// full recompute does not fit: the run then goes ahead and may run out of memory).
int graphBlocksFor(const config::Config& cfg, int world, int64_t budgetBytes);

// Whether a run of `cfg` has tcmalloc decommit every span it frees (core/memory.h), and so whether
// predictPeak and the time model count the run decommitted: only under a train.memory_budget, and
// not where the peak predicted without decommit lies within kKeepFreedShare of the budget's fit.
// Decommitted, a step faults in again every page it frees (the quick start ran 2.4x slower); kept,
// spans can pile up over steps, so a run whose resident set passes kDecommitAtShare of the fit
// after a step starts decommitting then (train/engine.cpp).
constexpr double kKeepFreedShare = 0.5, kDecommitAtShare = 0.75;
bool decommitsFreedMemory(const config::Config& cfg, int world, int graphBlocks);

// The per-rank budget "auto" uses: train.memory_budget, else 90% of rankMemoryLimitBytes.
int64_t memoryBudgetFor(const config::Config& cfg, int localRanks);

// The persistent model state of one rank: fp32 parameters, gradients, Adam m and v (and
// SuperOffload's rollback shadows). ZeRO-3 holds 1/world of each; stage 0 holds all of it.
struct ModelState {
  int64_t parameters = 0, gradients = 0, optimizer = 0;
};
ModelState modelState(const config::Config& cfg, int world);

// seq_len needs no padding at a multiple of this (P, or 2P with zigzag; others are padded) ...
int64_t seqLenMultiple(const config::Config& cfg);
// ... and at least this (kv_recall's BOS + pairs + queries; 2 otherwise).
int64_t minSeqLen(const config::Config& cfg);

// The longest valid seq_len whose predicted peak fits `budgetBytes` (binary search on
// the prediction, which is nondecreasing in seq_len); 0 when even the shortest does not fit.
// `cap`: the longest length considered (a result equal to it means "at least").
int64_t maxSeqLen(const config::Config& cfg, int world, int64_t budgetBytes, int64_t cap = int64_t{1} << 24);

// parseByteSize (core/strings.h) for --max-seq.
int64_t parseBytes(const std::string& s);

// One rung of the ALST ablation ladder: the options it turns on, applied to a config.
struct Rung {
  std::string name;                // "baseline", "+ tiled logits-loss", ...
  config::Config cfg;               // the config with the rung's options
  int world = 1;                   // ranks the rung runs on (its SP degree)
  std::vector<std::string> sets;   // the --set flags that reproduce it (with --nproc world)
  std::string skipped;             // non-empty: why the rung cannot run with this model
};
// Rungs 1..7: baseline (naive attention, untiled loss and MLP, SP = 1, no ZeRO); + tiled
// logits-loss; + chunked attention; + tiled MLP; + SP = 2; + SP = 4; + ZeRO-3 with
// SuperOffload; 8: + SP = 2 x max(4, heads), beyond the head count (Ulysses x ring).
// SP rungs split P by the head counts (sp/layout.h), so none is skipped for its heads.
// Chunk sizes are the config's where set, else 256 (attention) and 256 (loss).
std::vector<Rung> ablationLadder(const config::Config& base);

}  // namespace lt::plan
