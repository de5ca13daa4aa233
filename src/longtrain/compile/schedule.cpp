// Schedule validation and consumption.
#include "longtrain/compile/schedule.h"

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

}  // namespace lt::compile
