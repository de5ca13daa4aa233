// Formulas follow deepspeed/runtime/lr_schedules.py (warmup_num_steps is at least 2 there).
#include "longtrain/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace lt::train {

namespace {
double warmupGamma(const config::SchedulerConfig& s, int64_t it, int64_t warm) {
  if (s.warmupType == config::WarmupType::Linear) return static_cast<double>(it) / static_cast<double>(warm);
  return std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(warm));
}
}  // namespace

double lrAt(const config::SchedulerConfig& s, double baseLr, int64_t it) {
  if (s.type == config::SchedulerType::Constant) return baseLr;
  const int64_t warm = std::max<int64_t>(2, s.warmupNumSteps);
  if (s.type != config::SchedulerType::WarmupCosineLR) {  // WarmupLR, and WarmupDecayLR's linear decay to 0
    double maxLr = s.warmupMaxLr < 0 ? baseLr : s.warmupMaxLr;
    if (it < 0) return s.warmupMinLr;
    double gamma = it < warm ? warmupGamma(s, it, warm) : 1.0;
    if (it >= warm && s.type == config::SchedulerType::WarmupDecayLR)
      gamma = std::max(0.0, static_cast<double>(s.totalNumSteps - it) /
                                static_cast<double>(std::max<int64_t>(1, s.totalNumSteps - warm)));
    return s.warmupMinLr + (maxLr - s.warmupMinLr) * gamma;
  }
  // WarmupCosineLR: a ratio of the optimizer's lr.
  if (it < 0) return 0.0;
  if (it < warm) return baseLr * (s.warmupMinRatio + warmupGamma(s, it, warm) * (1.0 - s.warmupMinRatio));
  double realStep = static_cast<double>(it - warm + 1);
  double realTotal = static_cast<double>(std::max<int64_t>(1, s.totalNumSteps - warm));
  double progress = std::min(1.0, realStep / realTotal);
  double ratio = (1.0 + std::cos(M_PI * progress)) / 2.0;
  return baseLr * std::max(0.0, s.cosMinRatio + (1.0 - s.cosMinRatio) * ratio);
}

}  // namespace lt::train
