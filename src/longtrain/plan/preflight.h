// The memory preflight `train` runs before anything is allocated: the memory model's smallest
// peak for the config (every block recomputed, unless activation_checkpointing is "none")
// against what a rank may use. Non-obvious: the 1.2x margin covers the model's error (within
// 12% on bench/plan_accuracy.sh), so only a config that cannot fit is refused, with the figures,
// instead of std::bad_alloc or the OOM killer.
#pragma once
#include "longtrain/config/config.h"

namespace lt::plan {

// Throws lt::Error naming the need, the limit, the longest seq_len that fits and the fixes.
// No-op under train.memory_preflight=false or when the limit is unknown.
void preflightMemory(const config::Config& cfg, int world, int localRanks);

// The counts that size an allocation or a loop apart from the model (each in range alone):
// data.num_samples (an epoch's sample order, 8 bytes a sample on every rank) against a
// quarter of what a rank may use, data.eval_samples against data.num_samples. lt::Error
// naming the key, the need and the bound; not skipped by train.memory_preflight=false.
void preflightCounts(const config::Config& cfg, int localRanks);

}  // namespace lt::plan
