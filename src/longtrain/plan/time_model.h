// The time model behind `plan --fit`: one rank's optimizer-step time for a config, from rates
// this machine measures (train/measured_rates.h) and the work the config implies. Non-obvious:
// the rates are measured at the shapes the run uses (each GEMM at its own M, N, K; attention at
// the rank's heads and head dim; bandwidth at the working set's size), because a GEMM with K = 64
// runs at a fraction of the 1024^3 peak and a pointwise pass over 1 MiB runs from cache: one
// peak figure per machine would rank small and large shapes wrongly. Arithmetic is in double.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "longtrain/config/config.h"

namespace lt::plan {

// What the machine does, as seconds for a piece of work. Filled by train::measuredRates (which
// measures each shape once and caches it); tests fill it with closed forms.
struct Rates {
  // One linear layer over M rows, y = x W^T with W [N, K]: forward, and backward's two products.
  std::function<double(int64_t M, int64_t N, int64_t K)> linearForward, linearBackward;
  // Fused causal attention over B sequences of S tokens (queries = keys), `heads` query heads
  // and `kvHeads` kv heads of `dim`: forward, and backward (which recomputes the tiles).
  std::function<double(int64_t B, int64_t S, int64_t heads, int64_t kvHeads, int64_t dim)> attentionForward,
      attentionBackward;
  // Seconds per byte a pointwise pass streams (read and written) over tensors of `tensorBytes`:
  // memory bandwidth at that working set (from cache when it fits).
  std::function<double(double tensorBytes)> streamSecondsPerByte;
  // One small ATen op: dispatch, allocation, and waking the intra-op threads.
  double opSeconds = 0;
  // One decoder block of `m` over B sequences of S tokens with the model's own code and its
  // attention core: {forward, backward} seconds. What the pieces above leave out (ATen's
  // element-wise ops and layout copies, dispatch, thread wake-ups, operands not in cache) is in
  // it, so the model prices a block's work outside its GEMMs and attention from it, per token.
  // Null: priced from the pieces (tests' closed forms). The caller keeps B x S small.
  std::function<std::pair<double, double>(const config::ModelConfig& m, int64_t B, int64_t S)> block;
  // Adam on fp32 parameters: seconds per element (the vectorized CPU Adam).
  double adamSecondsPerElement = 0;
  // A collective's bytes between this host's ranks: seconds per byte each rank sends.
  double commSecondsPerByte = 0;
  // A byte across the link between nodes, one direction (a node's ranks share it); 0: one node.
  double linkSecondsPerByte = 0;
  // A byte given back to the system when freed and written again by the next tensor (page fault
  // and zeroing): what train.memory_budget's decommit costs (0: unmeasured).
  double refaultSecondsPerByte = 0;
  // train.offload_dir: seconds per byte written and read back (0: unmeasured, no offload).
  double diskSecondsPerByte = 0;
};

// One rank's step, by where its time goes (seconds). total() is what the rank waits for.
struct StepTime {
  double gemm = 0;        // the model's linear layers, recompute's forwards included
  double attention = 0;   // the fused attention core
  // Norms, RoPE, SwiGLU, residuals, layout copies and the loss's softmax; with a block rate, all
  // of a block's time outside its GEMMs and attention (its ops' dispatch and wake-ups too).
  double pointwise = 0;
  double overhead = 0;    // per-op dispatch and thread wake-ups not in a timed block
  double optimizer = 0;   // Adam over the rank's parameters (its partition under ZeRO)
  double comm = 0;        // collectives not hidden behind compute
  double commHidden = 0;  // collectives the compute hides (not in total(): ranks ties)
  double disk = 0;        // activation offload not hidden behind compute
  double decommit = 0;    // where the run decommits (plan::decommitsFreedMemory): re-faulting freed pages
  std::string modelled;   // "" or why the prediction is incomplete (an attention the model lacks)
  double total() const { return gemm + attention + pointwise + overhead + optimizer + comm + disk + decommit; }
};

// Where a job's ranks run: `ranksPerNode` adjacent ranks share a node (the launcher's rank order,
// torchrun's), so a group whose ranks span nodes sends over the link between them.
struct Placement {
  int world = 1, ranksPerNode = 1;
  static Placement oneNode(int world) { return {world, world}; }
};

// How a collective moves its bytes: a ring (all-reduce, reduce-scatter, all-gather, the ring
// attention's K/V steps: each step waits for its slowest hop) or all-to-all (every pair at once).
enum class Pattern { Ring, AllToAll };

// Seconds per byte a member sends in a collective over each of `groups` (world ranks, ascending),
// the slowest group's. Within a node: the loopback rate. A ring that spans nodes waits each step
// for its hop across, and a node's link carries one such hop for every spanning group with ranks
// on it. An all-to-all sends each member's off-node share over the link, which every member on
// the node of a spanning group uses at once.
double collectiveSecondsPerByte(const std::vector<std::vector<int>>& groups, Pattern p, const Placement& at,
                                const Rates& r);

// One optimizer step of `cfg` on `at`'s ranks when the last `graphBlocks` blocks keep their graph
// (the others are recomputed in backward).
StepTime predictStepTime(const config::Config& cfg, const Placement& at, int graphBlocks, const Rates& rates);
inline StepTime predictStepTime(const config::Config& cfg, int world, int graphBlocks, const Rates& rates) {
  return predictStepTime(cfg, Placement::oneNode(world), graphBlocks, rates);
}

// Tokens one optimizer step trains over the whole job: train_batch_size x seq_len.
double tokensPerStep(const config::Config& cfg);

}  // namespace lt::plan
