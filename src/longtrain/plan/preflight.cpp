// The memory preflight (see preflight.h).
#include "longtrain/plan/preflight.h"

#include <string>

#include "longtrain/core/check.h"
#include "longtrain/core/memory.h"
#include "longtrain/plan/memory_model.h"

namespace lt::plan {

void preflightMemory(const config::Config& cfg, int world, int localRanks) {
  const int64_t limit = rankMemoryLimitBytes(localRanks);
  if (!cfg.train.memoryPreflight || limit <= 0) return;
  const int k = cfg.activationCheckpointing == config::Recompute::None ? static_cast<int>(cfg.model.layers) : 0;
  const int64_t need = predictPeak(cfg, world, k).total();
  if (static_cast<double>(need) <= 1.2 * static_cast<double>(limit)) return;
  const int64_t longest = maxSeqLen(cfg, world, limit);
  constexpr int64_t kMiB = 1 << 20;
  LT_CHECK(false, "this config needs an estimated ", need / kMiB, " MiB per rank (longtrain plan's prediction) but a ",
           "rank may use ", limit / kMiB, " MiB (MemAvailable and the cgroup limit, shared by ", localRanks,
           " local rank(s)); ",
           longest > 0 ? "the longest data.seq_len that fits is " + std::to_string(longest)
                       : std::string("nothing fits at any data.seq_len"),
           ". Lower data.seq_len or the micro batch, or spread the state over more ranks (ZeRO-3, ",
           "sequence_parallel_size); train.memory_preflight=false skips this check");
}

}  // namespace lt::plan
