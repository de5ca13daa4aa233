// `plan --fit` and `train --fit`: every layout, ZeRO stage, tiling, offload and micro-batch split
// of a config that fits a per-rank budget, ranked by the time model. Non-obvious: a candidate is
// a list of --set overrides, parsed and validated as `train --set` would parse them, so what the
// plan ranks is exactly what the run will do, and an invalid combination (heads that do not
// split, a seq_len that does not divide) is dropped by the config's own rules, not restated here.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "longtrain/config/config.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/plan/time_model.h"

namespace lt::plan {

struct Candidate {
  std::vector<std::string> sets;  // the --set overrides that make it (key=JSON value)
  config::Config cfg;             // the config they give
  int graphBlocks = 0;            // blocks keeping their graph under the budget
  MemoryBreakdown peak;
  StepTime time;
  std::string describe() const;   // "SP 2 (Ulysses 2), ZeRO 1, loss_chunk 1024, ..."
};

struct FitResult {
  std::vector<Candidate> fitting;  // fastest first
  int considered = 0, invalid = 0, tooBig = 0;
  std::vector<std::string> notConsidered;  // choices left out, and why
};

// A config with `sets` applied over the user's (RunPlan applied), or an exception where the
// config's rules refuse the combination.
using ConfigWith = std::function<config::Config(const std::vector<std::string>&)>;

// Candidates of `base` on `at`'s ranks that fit `budget` bytes a rank (fitBytes), ranked by
// predicted step time under `rates`.
FitResult fit(const config::Config& base, const ConfigWith& with, const Placement& at, int64_t budget, const Rates& rates);

// The loss tile sizes --fit and "auto" choose from, least tiling first (0: the whole logits).
inline constexpr int64_t kLossChunkChoices[] = {0, 1024, 256};

// model.loss_chunk and model.tiled_mlp "auto": the least tiling with which the most blocks keep
// their graph within `budget` (tiling costs a few percent of a step, recompute a third of a
// block's); the most tiling when nothing fits. Keys the user set keep their values.
struct Tiling {
  int64_t lossChunk = 0;
  bool tiledMlp = false;
};
Tiling chooseTiling(const config::Config& cfg, int world, int64_t budget);

}  // namespace lt::plan
