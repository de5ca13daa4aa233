// compile/: every pass keeps losses bit-identical (ZeRO-3, 2 and 4 thread ranks), pass
// contracts and schedule errors, prefetch within its budget per the ledger, and one golden
// program listing per pass.
#include <nlohmann/json.hpp>

#include "longtrain/compile/passes.h"
#include "longtrain/compile/schedule.h"
#include "longtrain/core/check.h"
#include "longtrain/config/parse.h"
#include "longtrain/train/engine.h"
#include "testing.h"

namespace {

using json = nlohmann::json;
using lt::testing::runRanks;
using namespace lt::compile;

json compileConfig() {
  json j = lt::testing::tinyTrainConfig();
  j["gradient_clipping"] = 1.0;
  j["zero_optimization"] = {{"stage", 3}, {"sub_group_size", 3000}, {"stage3_param_persistence_threshold", 0}};
  j["compile"] = {{"deepcompile", true}};
  j["train"]["steps"] = 5;
  j["activation_checkpointing"] = "all";  // the passes rewrite checkpointed blocks (Forward/RecomputeBackward)
  return j;
}

using RunResult = lt::testing::TrainRun;

RunResult runSchedule(json j, const json& schedule, int world) {
  if (!schedule.is_null()) j["compile"]["schedule"] = schedule;
  return lt::testing::trainOnRanks(j, world, 1, 5)[0];
}

class PassEquivalence : public ::testing::TestWithParam<int> {};

TEST_P(PassEquivalence, LossesBitIdenticalToNoPass) {
  at::set_num_threads(1);
  const int world = GetParam();
  auto ref = runSchedule(compileConfig(), json::parse(R"([[0, ["zero3"]]])"), world);
  for (const char* sched : {R"([[0, ["zero3", "prefetch"]]])", R"([[0, ["zero3", "selective_gather"]]])",
                            R"([[0, ["zero3", "free_activations"]]])", R"([[0, ["zero3", "offload_activations"]]])",
                            R"([[0, ["zero3"]], [2, ["zero3", "prefetch", "selective_gather", "free_activations"]]])"}) {
    json j = compileConfig();
    if (std::string(sched).find("offload_activations") != std::string::npos)  // the pass needs its directory
      j["train"]["offload_dir"] = lt::testing::freshTempDir("longtrain_compile_offload_" + std::to_string(::getpid())).string();
    auto got = runSchedule(j, json::parse(sched), world);
    EXPECT_EQ(got.losses, ref.losses) << sched;
    ASSERT_EQ(got.params.size(), ref.params.size());
    for (size_t i = 0; i < ref.params.size(); ++i) EXPECT_TRUE(at::equal(got.params[i], ref.params[i])) << sched;
    EXPECT_NE(got.program, ref.program) << sched << ": the pass changed nothing";
  }
  auto dflt = runSchedule(compileConfig(), json(), world);  // DeepSpeed's default schedule
  EXPECT_EQ(dflt.losses, ref.losses);
}

// Blocks that keep their graph stay gathered from ForwardGraph to Backward; the passes
// around them (prefetch of the others, selective_gather) stay bit-neutral, and the result
// equals the checkpointed program's bit for bit.
TEST_P(PassEquivalence, KeptGraphsBitIdenticalToRecompute) {
  at::set_num_threads(1);
  const int world = GetParam();
  auto ref = runSchedule(compileConfig(), json::parse(R"([[0, ["zero3"]]])"), world);
  json keep = compileConfig();
  keep["activation_checkpointing"] = "none";
  for (const char* sched : {R"([[0, ["zero3"]]])", R"([[0, ["zero3", "prefetch", "selective_gather", "free_activations"]]])"}) {
    auto got = runSchedule(keep, json::parse(sched), world);
    EXPECT_NE(got.program.find("ForwardGraph(0)"), std::string::npos) << got.program;
    EXPECT_EQ(got.program.find("RecomputeBackward"), std::string::npos) << got.program;
    EXPECT_EQ(got.losses, ref.losses) << sched;
    for (size_t i = 0; i < ref.params.size(); ++i) EXPECT_TRUE(at::equal(got.params[i], ref.params[i])) << sched;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, PassEquivalence, ::testing::Values(2, 4));

using lt::testing::errorOf;

TEST(PassContracts, RequirementsAndDuplicates) {
  auto e = errorOf([] { validatePasses({"prefetch", "zero3"}, 5); });
  EXPECT_NE(e.find("step 5: pass 'prefetch' requires 'zero3', which no earlier pass of this step provides"),
            std::string::npos) << e;
  e = errorOf([] { validatePasses({"zero3", "zero3"}, 0); });
  EXPECT_NE(e.find("pass 'zero3' is listed twice"), std::string::npos) << e;
  EXPECT_NO_THROW(validatePasses({"zero3", "prefetch", "selective_gather"}, 5));
}

TEST(Schedule, ErrorsAndConsumption) {
  auto e = errorOf([] { Schedule({{5, {"zero3"}}, {3, {"zero3"}}}); });
  EXPECT_NE(e.find("compile.schedule[1]: step 3 must be greater than the previous entry's step 5"), std::string::npos)
      << e;
  e = errorOf([] { Schedule({{0, {"zero3"}}, {0, {"zero3"}}}); });
  EXPECT_NE(e.find("step 0 must be greater"), std::string::npos) << e;
  e = errorOf([] { Schedule({{0, {"zero3", "prefech"}}}); });
  EXPECT_NE(e.find("step 0: unknown pass 'prefech'; did you mean 'prefetch'?"), std::string::npos) << e;
  Schedule s(defaultZero3Schedule());
  EXPECT_EQ(s.take(0)->passes, (std::vector<std::string>{"zero3"}));
  EXPECT_FALSE(s.take(1).has_value());
  EXPECT_FALSE(s.take(4).has_value());
  EXPECT_EQ(s.take(5)->passes.size(), 3u);
  EXPECT_EQ(s.remaining(), 0u);
  // Through the config: a schedule entry without zero3 under ZeRO-3.
  json j = compileConfig();
  j["compile"]["schedule"] = json::parse(R"([[0, ["free_activations"]]])");
  e = errorOf([&] { runRanks(1, 1, [&](int, lt::comm::Groups& g) { lt::train::Engine(lt::config::parseConfig(j, 1), g); }); });
  EXPECT_NE(e.find("step 0: zero_optimization.stage=3 needs the 'zero3' pass in every entry"), std::string::npos) << e;
  j["compile"]["schedule"] = json::parse(R"([[0, "zero3"]])");
  e = errorOf([&] { lt::config::parseConfig(j, 1); });
  EXPECT_NE(e.find("'compile.schedule[0]' must be [step, [\"pass\", ...]]"), std::string::npos) << e;
}

TEST(Prefetch, StaysWithinItsBudgetPerTheLedger) {
  at::set_num_threads(1);
  // Blocks are 30976 bytes, the head 8320, the embedding 8192. A 50000-byte budget admits
  // prefetching the small groups but never a block while another block is gathered.
  const int64_t budget = 50000;
  json j = compileConfig();
  j["zero_optimization"]["stage3_max_live_parameters"] = budget / 4;
  auto got = runSchedule(j, json::parse(R"([[0, ["zero3", "prefetch"]]])"), 2);
  EXPECT_NE(got.program.find("Prefetch("), std::string::npos);  // some prefetches fit
  EXPECT_LE(got.gatheredPeak, budget);
  json wide = compileConfig();  // without the budget, blocks are prefetched too and the peak rises
  auto all = runSchedule(wide, json::parse(R"([[0, ["zero3", "prefetch"]]])"), 2);
  EXPECT_GT(all.gatheredPeak, budget);
}

TEST(Passes, GoldenListings) {
  PassContext c;
  c.numBlocks = 1;
  c.groupBytes = {30976, 8320, 8192};  // block 0, head, embed
  c.prefetchBucketBytes = 1 << 30;
  c.maxLiveBytes = 1 << 30;
  c.persistenceThresholdBytes = 8192;
  c.memoryBudgetBytes = 30976 + 8320 + 8192;
  auto base = baseProgram(1);
  auto listing = [&](std::vector<std::string> names) {
    std::string s = applyPasses(base, names, c).listing();
    std::replace(s.begin(), s.end(), '\n', ' ');
    return s;
  };
  EXPECT_EQ(listing({"zero3"}),
            "Gather(2) Embed(2) Release(2) Gather(0) Forward(0) Release(0) Gather(1) LossAndGrad(1) Release(1) "
            "ReduceGrads(1) Gather(0) RecomputeBackward(0) Release(0) ReduceGrads(0) EmbedBackward(2) ReduceGrads(2) "
            "OptimizerStep ");
  EXPECT_EQ(listing({"zero3", "prefetch"}),
            "Prefetch(0) Gather(2) Embed(2) Release(2) Prefetch(1) Gather(0) Forward(0) Release(0) Prefetch(0) "
            "Gather(1) LossAndGrad(1) Release(1) ReduceGrads(1) Gather(0) RecomputeBackward(0) Release(0) "
            "ReduceGrads(0) EmbedBackward(2) ReduceGrads(2) OptimizerStep ");
  c.maxLiveBytes = 40000;  // a block plus the head fits; two blocks would not
  auto two = baseProgram(2);
  PassContext c2 = c;
  c2.numBlocks = 2;
  c2.groupBytes = {30976, 30976, 8320, 8192};
  auto pre = applyPasses(two, {"zero3", "prefetch"}, c2);
  EXPECT_LE(simulateGatheredPeak(pre, c2.groupBytes), c2.maxLiveBytes);
  EXPECT_NE(pre.listing().find("Prefetch(2)"), std::string::npos);
  // The embedding is at the persistence threshold; the head fits the budget after the peak.
  EXPECT_EQ(listing({"zero3", "selective_gather"}),
            "Gather(2) Embed(2) Gather(0) Forward(0) Release(0) Gather(1) LossAndGrad(1) ReduceGrads(1) Gather(0) "
            "RecomputeBackward(0) Release(0) ReduceGrads(0) EmbedBackward(2) ReduceGrads(2) OptimizerStep ");
  EXPECT_EQ(listing({"free_activations"}),
            "Embed(2) Forward(0) LossAndGrad(1) ReduceGrads(1) RecomputeBackward(0) FreeActivation(0) ReduceGrads(0) "
            "EmbedBackward(2) ReduceGrads(2) OptimizerStep ");
  // The only recomputed block is the last: its input would come straight back after the loss.
  EXPECT_EQ(listing({"offload_activations"}), listing({}));
  // Three blocks: 0 and 1 go to disk; each comes back one block ahead (before the backward of
  // the block after it, and before that block's gather).
  PassContext c3 = c;
  c3.numBlocks = 3;
  c3.groupBytes = {30976, 30976, 30976, 8320, 8192};
  auto three = [&](std::vector<std::string> names) {
    std::string s = applyPasses(baseProgram(3), names, c3).listing();
    std::replace(s.begin(), s.end(), '\n', ' ');
    return s;
  };
  EXPECT_EQ(three({"free_activations", "offload_activations"}),
            "Embed(4) Forward(0) OffloadActivation(0) Forward(1) OffloadActivation(1) Forward(2) LossAndGrad(3) "
            "ReduceGrads(3) ReloadActivation(1) RecomputeBackward(2) FreeActivation(2) ReduceGrads(2) "
            "ReloadActivation(0) RecomputeBackward(1) FreeActivation(1) ReduceGrads(1) RecomputeBackward(0) "
            "FreeActivation(0) ReduceGrads(0) EmbedBackward(4) ReduceGrads(4) OptimizerStep ");
  EXPECT_EQ(three({"zero3", "offload_activations"}),
            "Gather(4) Embed(4) Release(4) Gather(0) Forward(0) OffloadActivation(0) Release(0) Gather(1) Forward(1) "
            "OffloadActivation(1) Release(1) Gather(2) Forward(2) Release(2) Gather(3) LossAndGrad(3) Release(3) "
            "ReduceGrads(3) ReloadActivation(1) Gather(2) RecomputeBackward(2) Release(2) ReduceGrads(2) "
            "ReloadActivation(0) Gather(1) RecomputeBackward(1) Release(1) ReduceGrads(1) Gather(0) "
            "RecomputeBackward(0) Release(0) ReduceGrads(0) EmbedBackward(4) ReduceGrads(4) OptimizerStep ");
  EXPECT_EQ(simulateGatheredPeak(applyPasses(base, {"zero3"}, c), c.groupBytes), 30976);
}

}  // namespace
