// The rates the time model prices a step with (plan::Rates), measured on this machine at the
// shapes a run uses, in this process, with its intra-op thread count. Non-obvious: each figure is
// the second best of five timed rounds, neither the best (the MFU peak's rule, train/peak_record.h:
// the model predicts the step a run will see) nor the median (a round can stall on a VM in a way
// a run does not: measured_rates.cpp). Each shape is measured once, when first asked for, and kept.
#pragma once
#include <string>

#include "longtrain/kernels/gemm.h"
#include "longtrain/plan/time_model.h"

namespace lt::train {

// GEMMs by `route` and the fused attention with bf16 tile products or not (`bf16Attention`, as
// the run resolves bf16.attention) on `threads` intra-op threads (the process's count is restored
// after each measurement); with `interRank`, the loopback TCP rate a collective between this
// host's ranks moves at; with an `offloadDir`, that directory's write-and-read rate.
plan::Rates measuredRates(kernels::GemmRoute route, bool bf16Attention, int threads, bool interRank,
                          const std::string& offloadDir);

}  // namespace lt::train
