// The fit search (fit.h): enumerate, parse, predict memory, price what fits, rank.
#include "longtrain/plan/fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "longtrain/config/parallel_layout.h"

namespace lt::plan {

namespace {

std::vector<int64_t> divisorsOf(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// One axis of the search: each choice is the --set overrides it adds.
using Axis = std::vector<std::vector<std::string>>;

// SP degree, ring degree and balance: every split of the world the heads allow.
Axis layouts(int world) {
  Axis out;
  for (int64_t P : divisorsOf(world)) {
    const std::string sp = fmt::format("sequence_parallel_size={}", P);
    if (P == 1) {
      out.push_back({sp});
      continue;
    }
    for (int64_t R : divisorsOf(P)) {
      const std::string ring = fmt::format("sequence_parallel_ring_degree={}", R);
      if (R == 1) out.push_back({sp, ring, "sequence_parallel_balance=\"contiguous\""});
      else
        for (const char* b : {"zigzag", "contiguous"})
          out.push_back({sp, ring, fmt::format("sequence_parallel_balance=\"{}\"", b)});
    }
  }
  return out;
}

Axis zeroStages(int world) {
  Axis out;
  for (int stage = 0; stage <= (world > 1 ? 3 : 0); ++stage)
    out.push_back({fmt::format("zero_optimization.stage={}", stage)});
  return out;
}

Axis tilings() {
  Axis out;
  for (int64_t chunk : kLossChunkChoices)
    for (bool mlp : {false, true})
      out.push_back({fmt::format("model.loss_chunk={}", chunk), fmt::format("model.tiled_mlp={}", mlp)});
  return out;
}

// Micro-batch x accumulation splits of the batch a data-parallel rank trains each step, keeping the
// job's train_batch_size (so every candidate trains the same tokens a step).
Axis batchSplits(const config::Config& base, int world) {
  Axis out;
  for (int64_t P : divisorsOf(world)) {
    const int64_t dp = world / P;
    if (base.trainBatchSize % dp != 0) continue;
    const int64_t perRank = base.trainBatchSize / dp;
    for (int64_t micro : divisorsOf(perRank))
      out.push_back({fmt::format("train_batch_size={}", base.trainBatchSize),
                     fmt::format("train_micro_batch_size_per_gpu={}", micro),
                     fmt::format("gradient_accumulation_steps={}", perRank / micro)});
  }
  return out;
}

Axis offloads(const config::Config& base) {
  if (base.train.offloadDir.empty()) return {{}};
  return {{}, {"train.offload_dir=\"\""}};
}

// The cartesian product of the axes, each candidate's sets concatenated.
std::vector<std::vector<std::string>> product(const std::vector<Axis>& axes) {
  std::vector<std::vector<std::string>> out{{}};
  for (const auto& axis : axes) {
    std::vector<std::vector<std::string>> next;
    for (const auto& prefix : out)
      for (const auto& choice : axis) {
        auto c = prefix;
        c.insert(c.end(), choice.begin(), choice.end());
        next.push_back(std::move(c));
      }
    out = std::move(next);
  }
  return out;
}

}  // namespace

std::string Candidate::describe() const {
  const auto& c = cfg;
  std::string sp = c.sequenceParallelSize == 1 ? "no SP" : "SP " + c.layout.describe();
  return fmt::format("{}, ZeRO {}, loss_chunk {}, tiled_mlp {}, micro {} x accum {}, {} of {} blocks recomputed{}", sp,
                     c.zero.stage, c.model.lossChunk, c.model.tiledMlp ? "on" : "off", c.microBatch, c.gradAccum,
                     c.model.layers - graphBlocks, c.model.layers, c.train.offloadDir.empty() ? "" : ", disk offload");
}

FitResult fit(const config::Config& base, const ConfigWith& with, const Placement& at, int64_t budget, const Rates& rates) {
  FitResult out;
  const int world = at.world;
  const std::vector<std::string> fixed = {"model.attention=\"fused\"", "activation_checkpointing=\"auto\"",
                                          fmt::format("train.memory_budget={}", budget)};
  for (auto sets : product({layouts(world), zeroStages(world), tilings(), batchSplits(base, world), offloads(base)})) {
    ++out.considered;
    sets.insert(sets.begin(), fixed.begin(), fixed.end());
    Candidate c;
    try {
      c.cfg = with(sets);
    } catch (const std::exception&) {
      ++out.invalid;
      continue;
    }
    c.graphBlocks = graphBlocksFor(c.cfg, world, budget);
    c.peak = predictPeak(c.cfg, world, c.graphBlocks);
    if (c.peak.total() > fitBytes(budget)) {
      ++out.tooBig;
      continue;
    }
    c.sets = std::move(sets);
    c.time = predictStepTime(c.cfg, at, c.graphBlocks, rates);
    out.fitting.push_back(std::move(c));
  }
  // Fastest first; at the same time, less traffic on the links, then less memory.
  std::stable_sort(out.fitting.begin(), out.fitting.end(), [](const Candidate& a, const Candidate& b) {
    return std::make_tuple(a.time.total(), a.time.commHidden, a.peak.total()) <
           std::make_tuple(b.time.total(), b.time.commHidden, b.peak.total());
  });
  out.notConsidered = {
      "attention other than \"fused\" (it is the fastest and smallest kernel)",
      "SuperOffload (on a CPU host the optimizer state it moves stays in the same memory, and its rollback "
      "shadows add to it)"};
  if (base.train.offloadDir.empty()) out.notConsidered.push_back("disk offload (set train.offload_dir to include it)");
  return out;
}

Tiling chooseTiling(const config::Config& cfg, int world, int64_t budget) {
  const auto& m = cfg.model;
  std::vector<Tiling> options;  // least tiling first: the loss tiled before the MLP
  for (bool mlp : {false, true})
    for (int64_t chunk : kLossChunkChoices) {
      if (!m.lossChunkAuto && chunk != 0) continue;
      if (!m.tiledMlpAuto && mlp) continue;
      options.push_back({m.lossChunkAuto ? chunk : m.lossChunk, m.tiledMlpAuto ? mlp : m.tiledMlp});
    }
  int bestBlocks = -1;
  Tiling best = options.back();
  for (const auto& t : options) {
    config::Config c = cfg;
    c.model.lossChunk = t.lossChunk;
    c.model.tiledMlp = t.tiledMlp;
    const int k = graphBlocksFor(c, world, budget);
    if (predictPeak(c, world, k).total() > fitBytes(budget)) continue;
    if (k > bestBlocks) {
      bestBlocks = k;
      best = t;
    }
  }
  return best;
}

}  // namespace lt::plan
