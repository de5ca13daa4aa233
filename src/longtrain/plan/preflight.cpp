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

void preflightCounts(const config::Config& cfg, int localRanks) {
  const auto& d = cfg.data;
  if (d.tokenFile()) return;  // a token file's windows are counted by the file
  LT_CHECK(d.evalSamples <= d.numSamples, "config key 'data.eval_samples' = ", d.evalSamples, " is more than ",
           "data.num_samples=", d.numSamples, ": every evaluation would run them all; lower data.eval_samples");
  const int64_t limit = rankMemoryLimitBytes(localRanks);
  const int64_t need = 8 * d.numSamples;  // numSamples <= 2^50: no overflow
  constexpr int64_t kMiB = 1 << 20;
  LT_CHECK(limit <= 0 || need <= limit / 4, "config key 'data.num_samples' = ", d.numSamples, ": an epoch's ",
           "sample order takes 8 bytes a sample, ", need / kMiB, " MiB on every rank, more than a quarter of the ",
           limit / kMiB, " MiB a rank may use; lower data.num_samples to at most ", limit / 32,
           " (kv_recall samples are generated: more do not make the task harder)");
}

}  // namespace lt::plan
