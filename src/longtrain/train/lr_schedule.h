// DeepSpeed's learning-rate schedules, WarmupLR and WarmupCosineLR, with DeepSpeed's step
// convention: the scheduler starts at iteration -1 (so the first optimizer step runs at the
// schedule's start value) and advances once after every optimizer step.
#pragma once
#include <cstdint>

#include "longtrain/config/config.h"

namespace lt::train {

// The learning rate DeepSpeed's scheduler gives at `iteration` (last_batch_iteration).
double lrAt(const config::SchedulerConfig& s, double baseLr, int64_t iteration);

}  // namespace lt::train
