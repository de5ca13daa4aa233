// Schedule validation and consumption.
#include "longtrain/compile/schedule.h"

#include <algorithm>

#include "longtrain/compile/passes.h"
#include "longtrain/core/check.h"

namespace lt::compile {

Schedule::Schedule(const std::vector<ScheduleEntry>& entries) {
  int64_t prev = -1;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    LT_CHECK(e.step > prev, "compile.schedule[", i, "]: step ", e.step, " must be greater than the previous entry's ",
             "step ", prev, " (steps strictly increase, each at most once)");
    validatePasses(e.passes, e.step);
    prev = e.step;
    fifo_.push(e);
  }
}

std::optional<ScheduleEntry> Schedule::take(int64_t step) {
  std::optional<ScheduleEntry> out;
  // On resume past several entries, the latest one reached wins (passes are not cumulative).
  while (!fifo_.empty() && fifo_.front().step <= step) out = fifo_.pop();
  return out;
}

std::vector<ScheduleEntry> defaultZero3Schedule() {
  return {{0, {"zero3"}}, {5, {"zero3", "prefetch", "selective_gather"}}};
}

std::vector<std::string> fixedPasses(const config::Config& cfg) {
  std::vector<std::string> passes;
  if (cfg.zero.stage == 3) passes.push_back("zero3");
  passes.push_back("free_activations");
  if (!cfg.train.offloadDir.empty()) passes.push_back("offload_activations");
  return passes;
}

std::vector<ScheduleEntry> scheduleOf(const config::Config& cfg) {
  std::vector<ScheduleEntry> entries = cfg.compile.schedule ? *cfg.compile.schedule
                                       : cfg.zero.stage == 3 ? defaultZero3Schedule()
                                                             : std::vector<ScheduleEntry>{{0, {"free_activations"}}};
  const std::string offload = "offload_activations";
  if (!cfg.train.offloadDir.empty())
    for (auto& e : entries)
      if (std::find(e.passes.begin(), e.passes.end(), offload) == e.passes.end()) e.passes.push_back(offload);
  return entries;
}

}  // namespace lt::compile
