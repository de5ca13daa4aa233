// The five passes and their contracts. Budgets are in bytes of fp32 parameters.
#include "longtrain/compile/passes.h"

#include <algorithm>
#include <set>

#include "longtrain/core/check.h"
#include "longtrain/core/strings.h"

namespace lt::compile {

namespace {

bool isCompute(OpCode op) {
  return op == OpCode::Embed || op == OpCode::Forward || op == OpCode::LossAndGrad ||
         op == OpCode::RecomputeBackward || op == OpCode::ForwardGraph || op == OpCode::Backward;
}

// zero3: gather each group right before an instruction that reads it, release right after.
// A block whose graph is kept stays gathered from its ForwardGraph to its Backward: the
// graph saved the parameter tensors themselves, and a release would empty them under it.
Program passZero3(const Program& p, const PassContext& c) {
  Program z;
  for (const auto& in : p.code) {
    LT_ASSERT(in.op != OpCode::Gather && in.op != OpCode::Release, "zero3 applied twice");
    auto used = paramGroupsUsed(in, c.numBlocks, c.tiedEmbeddings);
    if (in.op != OpCode::Backward)
      for (int g : used) z.code.push_back({OpCode::Gather, g});
    z.code.push_back(in);
    if (in.op != OpCode::ForwardGraph)
      for (auto it = used.rbegin(); it != used.rend(); ++it) z.code.push_back({OpCode::Release, *it});
  }
  return z;
}

// Live gathered bytes before each instruction of p.
std::vector<int64_t> liveGathered(const Program& p, const std::vector<int64_t>& bytes) {
  std::vector<int64_t> live(p.code.size() + 1, 0);
  std::set<int> held;
  int64_t cur = 0;
  for (size_t i = 0; i < p.code.size(); ++i) {
    live[i] = cur;
    const auto& in = p.code[i];
    if ((in.op == OpCode::Gather || in.op == OpCode::Prefetch) && held.insert(in.group).second)
      cur += bytes[in.group];
    if (in.op == OpCode::Release && held.erase(in.group)) cur -= bytes[in.group];
  }
  live[p.code.size()] = cur;
  return live;
}

// prefetch: start each Gather(g) one compute instruction earlier, as an async Prefetch(g),
// when g fits the prefetch bucket and the live parameters stay within max_live. The
// Gather(g) stays, and waits for the prefetched data.
Program passPrefetch(const Program& p, const PassContext& c) {
  Program out = p;
  // In program order, so each decision sees the prefetches already placed before it.
  for (size_t i = 0; i < out.code.size(); ++i) {
    const Instr in = out.code[i];
    if (in.op != OpCode::Gather) continue;
    const int64_t b = c.groupBytes[in.group];
    if (c.prefetchBucketBytes > 0 && b > c.prefetchBucketBytes) continue;
    // The compute instruction before this gather, then back over the Gathers feeding it,
    // so the prefetch overlaps that whole instruction.
    int j = static_cast<int>(i) - 1;
    while (j >= 0 && !isCompute(out.code[j].op)) --j;
    if (j < 0) continue;
    while (j > 0 && out.code[j - 1].op == OpCode::Gather) --j;
    // Not across an earlier use of the same group (it is released after that use).
    bool clash = false;
    for (size_t k = j; k < i; ++k)
      if ((out.code[k].op == OpCode::Gather || out.code[k].op == OpCode::Release ||
           out.code[k].op == OpCode::Prefetch) && out.code[k].group == in.group)
        clash = true;
    if (clash) continue;
    auto live = liveGathered(out, c.groupBytes);
    int64_t peak = 0;
    for (size_t k = j; k <= i; ++k) peak = std::max(peak, live[k + 1]);  // live after each
    peak = std::max(peak, live[j]);
    if (c.maxLiveBytes > 0 && peak + b > c.maxLiveBytes) continue;
    out.code.insert(out.code.begin() + j, Instr{OpCode::Prefetch, in.group});
    ++i;  // the gather moved one slot on
  }
  return out;
}

// selective_gather: keep chosen groups gathered for the whole step (their Releases go;
// ZeRO-3 releases everything after the optimizer step, so the next step re-gathers them
// once). Groups at or below the persistence threshold always stay; then, greedily by
// profiled gather seconds per byte (or smallest first without a profile), groups that fit
// the budget left after the profiled peak.
Program passSelectiveGather(const Program& p, const PassContext& c) {
  const int numGroups = static_cast<int>(c.groupBytes.size());
  std::vector<char> keep(numGroups, 0);
  for (int g = 0; g < numGroups; ++g)
    if (c.groupBytes[g] <= c.persistenceThresholdBytes) keep[g] = 1;
  std::vector<double> secs;
  const bool prof = c.profile && c.profile->valid();
  if (prof) secs = c.profile->gatherSecondsByGroup(numGroups);
  std::vector<int> order(numGroups);
  for (int g = 0; g < numGroups; ++g) order[g] = g;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (prof) return secs[a] / c.groupBytes[a] > secs[b] / c.groupBytes[b];
    return c.groupBytes[a] < c.groupBytes[b];
  });
  int64_t peak = prof ? c.profile->peakLive : simulateGatheredPeak(p, c.groupBytes);
  int64_t room = c.memoryBudgetBytes - peak;
  for (int g : order) {
    if (keep[g]) continue;
    if (c.groupBytes[g] <= room) {
      keep[g] = 1;
      room -= c.groupBytes[g];
    }
  }
  Program out;
  for (const auto& in : p.code)
    if (!(in.op == OpCode::Release && keep[in.group])) out.code.push_back(in);
  return out;
}

// free_activations: free each kept block input (and kept graph) right after its last use.
Program passFreeActivations(const Program& p, const PassContext&) {
  Program out;
  for (const auto& in : p.code) {
    out.code.push_back(in);
    if (in.op == OpCode::RecomputeBackward || in.op == OpCode::Backward)
      out.code.push_back({OpCode::FreeActivation, in.group});
  }
  return out;
}

// offload_activations: after Forward(b) the input of block b goes to disk (OffloadActivation);
// it is read back one block ahead, before the compute instruction that precedes block b's
// RecomputeBackward (and that instruction's gathers), so the read overlaps the backward of
// block b+1. The last recomputed block's input is not offloaded: it would be read back at once,
// right after the loss. Blocks that keep their graph are left alone: the graph holds the input.
Program passOffloadActivations(const Program& p, const PassContext&) {
  int last = -1;  // the block whose RecomputeBackward comes first
  for (const auto& in : p.code)
    if (in.op == OpCode::RecomputeBackward) {
      last = in.group;
      break;
    }
  Program out;
  std::vector<int> offloaded;
  for (const auto& in : p.code) {
    out.code.push_back(in);
    if (in.op == OpCode::Forward && in.group != last) {
      out.code.push_back({OpCode::OffloadActivation, in.group});
      offloaded.push_back(in.group);
    }
  }
  for (int b : offloaded) {
    size_t use = 0;
    while (use < out.code.size() && !(out.code[use].op == OpCode::RecomputeBackward && out.code[use].group == b)) ++use;
    if (use == out.code.size()) continue;  // never recomputed (no backward): nothing to read back
    size_t at = use;
    while (at > 0 && !isCompute(out.code[at - 1].op)) --at;  // back to the previous compute instruction
    if (at > 0) --at;
    while (at > 0 && (out.code[at - 1].op == OpCode::Gather || out.code[at - 1].op == OpCode::Prefetch)) --at;
    out.code.insert(out.code.begin() + static_cast<std::ptrdiff_t>(at), Instr{OpCode::ReloadActivation, b});
  }
  return out;
}

}  // namespace

std::vector<double> Profile::gatherSecondsByGroup(int numGroups) const {
  std::vector<double> s(numGroups, 0);
  for (size_t i = 0; i < instrs.size() && i < program.code.size(); ++i)
    if (program.code[i].op == OpCode::Gather || program.code[i].op == OpCode::Prefetch)
      s[program.code[i].group] += instrs[i].seconds;
  return s;
}

int64_t simulateGatheredPeak(const Program& p, const std::vector<int64_t>& groupBytes) {
  auto live = liveGathered(p, groupBytes);
  return *std::max_element(live.begin(), live.end());
}

const std::vector<PassInfo>& passRegistry() {
  static const std::vector<PassInfo> r{
      {"zero3", {"zero3"}, {}, passZero3},
      {"prefetch", {"prefetch"}, {"zero3"}, passPrefetch},
      {"selective_gather", {"selective_gather"}, {"zero3"}, passSelectiveGather},
      {"free_activations", {"free_activations"}, {}, passFreeActivations},
      {"offload_activations", {"offload_activations"}, {}, passOffloadActivations},
  };
  return r;
}

static const PassInfo& findPass(const std::string& name, int64_t step, const std::vector<PassInfo>& registry) {
  for (const auto& p : registry)
    if (p.name == name) return p;
  std::vector<std::string> names;
  for (const auto& p : registry) names.push_back(p.name);
  const std::string best = closestName(name, names);
  LT_CHECK(false, "compile.schedule: step ", step, ": unknown pass '", name, "'; did you mean '", best, "'?");
  return registry.front();
}

void validatePasses(const std::vector<std::string>& names, int64_t step, const std::vector<PassInfo>& registry) {
  std::set<std::string> provided;
  for (size_t i = 0; i < names.size(); ++i) {
    const PassInfo& p = findPass(names[i], step, registry);
    for (size_t k = 0; k < i; ++k) {
      LT_CHECK(names[k] != p.name, "compile.schedule: step ", step, ": pass '", p.name, "' is listed twice");
    }
    for (const auto& need : p.needs)
      LT_CHECK(provided.count(need), "compile.schedule: step ", step, ": pass '", p.name, "' requires '", need,
               "', which no earlier pass of this step provides; list a pass providing it before '", p.name, "'");
    provided.insert(p.provides.begin(), p.provides.end());
  }
}

Program applyPasses(const Program& base, const std::vector<std::string>& names, const PassContext& ctx,
                    const std::vector<PassInfo>& registry) {
  Program p = base;
  for (const auto& n : names) {
    p = findPass(n, -1, registry).fn(p, ctx);
    for (size_t pc = 0; pc + 1 < p.code.size(); ++pc)  // the engine steps after the program returns
      LT_ASSERT(p.code[pc].op != OpCode::OptimizerStep, "pass '", n, "' put OptimizerStep at ", pc,
                ", before the program's end");
  }
  return p;
}

PassContext PassContext::from(const config::Config& cfg, int numBlocks, std::vector<int64_t> groupBytes) {
  constexpr int64_t kFp32 = sizeof(float);  // ZeRO's limits count elements; gathered parameters are fp32
  PassContext c;
  c.numBlocks = numBlocks;
  c.tiedEmbeddings = cfg.model.tieEmbeddings;
  c.groupBytes = std::move(groupBytes);
  c.prefetchBucketBytes = cfg.zero.prefetchBucketSize * kFp32;
  c.maxLiveBytes = cfg.zero.maxLiveParameters * kFp32;
  c.persistenceThresholdBytes = cfg.zero.paramPersistenceThreshold * kFp32;
  c.memoryBudgetBytes = c.maxLiveBytes;
  return c;
}

}  // namespace lt::compile
