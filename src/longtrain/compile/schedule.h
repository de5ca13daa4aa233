// The pass schedule (DeepCompile's): a list of (step, passes) entries, validated before step
// 0 and consumed from an O(1) Fifo as the global step reaches them. Each entry rebuilds the
// program from the base with its whole pass list (passes are not cumulative).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "longtrain/config/config.h"
#include "longtrain/core/fifo.h"

namespace lt::compile {

using config::ScheduleEntry;  // (step, passes), as compile.schedule gives it

class Schedule {
 public:
  Schedule() = default;
  // Validates: steps strictly increasing and >= 0, pass names known, contracts per entry.
  explicit Schedule(const std::vector<ScheduleEntry>& entries);
  // The entry to apply at `step` (0-based global step), if the schedule's head has reached it.
  std::optional<ScheduleEntry> take(int64_t step);
  size_t remaining() const { return fifo_.size(); }

 private:
  Fifo<ScheduleEntry> fifo_;
};

// DeepSpeed's default ZeRO-3 schedule: [[0, ["zero3"]], [5, ["zero3", "prefetch", "selective_gather"]]].
std::vector<ScheduleEntry> defaultZero3Schedule();

// The passes of a run without DeepCompile: zero3 at stage 3, free_activations, and
// offload_activations where train.offload_dir is set.
std::vector<std::string> fixedPasses(const config::Config& cfg);
// The schedule of a run with DeepCompile: compile.schedule, else DeepSpeed's default for the
// stage; offload_activations joins every entry where train.offload_dir is set (validate()
// refused the pass without the directory).
std::vector<ScheduleEntry> scheduleOf(const config::Config& cfg);

}  // namespace lt::compile
