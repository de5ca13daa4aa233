// The process baseline `longtrain plan` counts (plan::ProcessBaseline): measured, not assumed,
// by 1-step runs of this same binary on a model whose tensors are < 1 MiB (one rank, or two for
// any world > 1), one without and one with train.memory_budget (which decommits freed memory),
// recorded per binary in the per-machine records (peak_record.h). Non-obvious:
// which of that run's free memory later tensors reuse, fitted on bench/plan_accuracy.sh: at one
// rank none, at several all of tcmalloc's free pages (a process group's start-up frees ~45 MiB
// of whole buffers a rank, the same at 2 and 4 ranks).
#pragma once
#include <cstdint>

namespace lt::train {

// For a rank of a `world`-rank run, `localRanks` of them on its host, with `threads` intra-op
// threads (0: the host's cores divided among its ranks): from the record, else from a calibration
// run on 1 or (world > 1) 2 ranks, then recorded; where none can run, this process after a GEMM
// warm-up. Sets plan::setProcessBaseline; returns the resident bytes.
int64_t calibrateProcessBaseline(int world, int localRanks, int threads);

// The intra-op threads a rank uses: train.threads (`threads`) when positive, else this host's
// cores divided among its `localRanks` ranks.
int rankThreads(int localRanks, int threads);

// Inside a rank, after its bring-up: as above, but no calibration run is started (without a
// record, this rank's own RSS).
int64_t rankProcessBaseline(int world, int localRanks, int threads);

}  // namespace lt::train
