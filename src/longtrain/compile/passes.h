// Compile passes over the step program (DeepCompile's, on an explicit program instead of an
// FX graph). Each pass is a pure function Program -> Program of the program, a profile of a
// previous step and memory budgets; none changes numerics (the compile-pass equivalence), only
// when parameters are gathered and how long activations live. Each declares what it
// provides and requires; a pass list is valid when every requirement is provided by an
// earlier pass in the same list. (DeepCompile's contracts also have conflicts_with; no pass
// here conflicts with another, so there is no such field until one does.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "longtrain/compile/program.h"
#include "longtrain/config/config.h"

namespace lt::compile {

// What a profiled step measured, per instruction of the program it ran (max over ranks).
struct InstrProfile {
  double seconds = 0;
  int64_t liveBefore = 0, liveAfter = 0;  // ledger: gathered parameters + kept activations
};
struct Profile {
  Program program;  // the program the profile was taken on
  std::vector<InstrProfile> instrs;
  int64_t peakLive = 0;
  bool valid() const { return !instrs.empty() && instrs.size() == program.code.size(); }
  // Seconds spent in Gather(g) instructions (waiting for parameters), per group.
  std::vector<double> gatherSecondsByGroup(int numGroups) const;
};

struct PassContext {
  int numBlocks = 0;
  bool tiedEmbeddings = false;
  std::vector<int64_t> groupBytes;  // full fp32 bytes of each parameter group
  const Profile* profile = nullptr; // may be null or invalid: passes then use sizes only
  int64_t prefetchBucketBytes = 0;  // stage3_prefetch_bucket_size x 4
  int64_t maxLiveBytes = 0;         // stage3_max_live_parameters x 4
  int64_t persistenceThresholdBytes = 0;  // stage3_param_persistence_threshold x 4
  int64_t memoryBudgetBytes = 0;    // bytes selective_gather may keep gathered

  // The config's stage3_* limits in fp32 bytes, for a model of `groupBytes` (its groups' sizes).
  static PassContext from(const config::Config& cfg, int numBlocks, std::vector<int64_t> groupBytes);
};

using PassFn = Program (*)(const Program&, const PassContext&);

struct PassInfo {
  std::string name;
  std::vector<std::string> provides, needs;
  PassFn fn;
};

// zero3, prefetch, selective_gather, free_activations, offload_activations.
const std::vector<PassInfo>& passRegistry();

// Throws lt::Error naming `step` and the offending pass (unknown name with the closest
// known one, a pass listed twice, or an unmet requirement).
void validatePasses(const std::vector<std::string>& names, int64_t step,
                    const std::vector<PassInfo>& registry = passRegistry());

// Applies the passes in order to `base` (the program without any pass).
Program applyPasses(const Program& base, const std::vector<std::string>& names, const PassContext& ctx,
                    const std::vector<PassInfo>& registry = passRegistry());

// Peak of gathered parameter bytes along the program, by its Gather/Prefetch/Release.
int64_t simulateGatheredPeak(const Program& p, const std::vector<int64_t>& groupBytes);

}  // namespace lt::compile
