// The GEMM peak MFU is judged against, the same from one launch to the next. A single start-up
// measurement moves with whatever else the machine is doing (105 to 188 GFLOP/s seen on one
// machine), so each launch's measurement joins a per-machine record and the peak is the best
// the record holds for this CPU model, thread count, GEMM route and libtorch. Non-obvious: the
// best, not a mean: a GEMM cannot run faster than the machine allows, so the maximum converges
// to the true peak from below while noise only ever pulls a measurement down.
#pragma once
#include <string>

#include "longtrain/kernels/gemm.h"

namespace lt::train {

struct GemmPeak {
  double flops = 0;
  std::string source;  // for the banner: where the figure comes from
};

// The peak for `route` at the current thread count: `configured` (train.peak_flops, per rank)
// when positive; else the best of `measured` and the record, which is updated. The record lives
// in LONGTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/longtrain, else ~/.cache/longtrain
// (gemm_peaks.json); where none is writable the measurement stands alone.
GemmPeak robustGemmPeak(kernels::GemmRoute route, double measured, double configured);

// The record's directory as above ("" when no variable names one).
std::string peakRecordDir();

}  // namespace lt::train
