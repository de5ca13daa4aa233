// The machine's fast paths (issue "Step speed I"): the BLAS kernel check and its re-exec (with
// train's OpenMP spin count), the kernel's numerics, MFU's FLOP count, activation checkpointing's
// choice and its bit-identity with recompute (plain, SP, ZeRO-3 + SuperOffload), and stage 0's
// CPU Adam (including the skipped step on a non-finite gradient), and when a memory budget
// decommits freed memory.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <limits>

#include "longtrain/core/cpu.h"
#include "longtrain/core/memory.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/train/machine.h"
#include "testing.h"

namespace {

using json = nlohmann::json;
using lt::testing::Tol;

TEST(BlasKernel, BetterCoreForEachIsa) {
  lt::CpuIsa avx512{true, true, false}, avx2{true, false, false}, zen{true, false, true}, old{};
  EXPECT_EQ(lt::betterBlasCore("Prescott", avx512), "SkylakeX");
  EXPECT_EQ(lt::betterBlasCore("Haswell", avx512), "SkylakeX");  // AVX2 kernel on an AVX-512 CPU
  EXPECT_EQ(lt::betterBlasCore("SkylakeX", avx512), "");
  EXPECT_EQ(lt::betterBlasCore("Cooperlake", avx512), "");
  EXPECT_EQ(lt::betterBlasCore("SAPPHIRERAPIDS", avx512), "");  // names compare case-blind
  EXPECT_EQ(lt::betterBlasCore("Prescott", avx2), "Haswell");
  EXPECT_EQ(lt::betterBlasCore("Sandybridge", avx2), "Haswell");
  EXPECT_EQ(lt::betterBlasCore("Prescott", zen), "Zen");
  EXPECT_EQ(lt::betterBlasCore("Zen", zen), "");
  EXPECT_EQ(lt::betterBlasCore("Haswell", zen), "");
  EXPECT_EQ(lt::betterBlasCore("Prescott", old), "");  // nothing better to pick
  EXPECT_EQ(lt::betterBlasCore("Core2", old), "");
}

TEST(BlasKernel, ThisProcessComputesRightAndIsNotBelowTheCpuThroughTheCli) {
  // The test binary does not re-execute itself; the longtrain binary does.
  EXPECT_LE(lt::train::gemmRelativeError(), Tol::kBlasKernel);
  auto r = lt::testing::runCommand(std::string(LONGTRAIN_BIN) + " info --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("gemm relative error"), std::string::npos) << r.out;
  const auto at = r.out.find("gemm relative error: ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LE(std::stod(r.out.substr(at + 21)), Tol::kBlasKernel) << r.out;
  if (!lt::blasCoreName().empty()) {  // OpenBLAS: the binary's kernel is the CPU's best (or the user's)
    const bool userSet = std::getenv("OPENBLAS_CORETYPE") != nullptr;
    EXPECT_TRUE(userSet || r.out.find("below this CPU") == std::string::npos) << r.out;
  }
}

TEST(BlasKernel, ReexecutesOnceWithTheBetterCoreAndKeepsTheUsersChoice) {
  if (lt::blasCoreName().empty()) GTEST_SKIP() << "the BLAS is not OpenBLAS";
  // Pretend OpenBLAS chose Prescott: the binary sets OPENBLAS_CORETYPE and re-executes.
  auto r = lt::testing::runCommand("env LONGTRAIN_FAULT_BLAS_CORE=Prescott " + std::string(LONGTRAIN_BIN) + " info --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string better = lt::betterBlasCore("Prescott", lt::cpuIsa());
  if (std::getenv("OPENBLAS_CORETYPE")) {
    EXPECT_NE(r.out.find("from the environment"), std::string::npos) << r.out;  // kept, no re-exec
  } else if (!better.empty()) {
    EXPECT_NE(r.out.find("core=" + better), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(fixed from Prescott)"), std::string::npos) << r.out;
  }
}

TEST(OmpSpin, TrainRunsWithAShortSpinUnlessTheUserSetsOne) {
  // libgomp prints the spin count it read at start with OMP_DISPLAY_ENV=verbose (to stderr).
  const std::string run = std::string(LONGTRAIN_BIN) + " train " + LONGTRAIN_SOURCE_DIR +
                          "/bench/e2e_quickstart.json --set train.steps=1";
  auto r = lt::testing::runCommand("env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=verbose " + run);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("GOMP_SPINCOUNT = '10000'"), std::string::npos) << r.out;  // the re-executed image
  r = lt::testing::runCommand("env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=5000 OMP_DISPLAY_ENV=verbose " + run);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("GOMP_SPINCOUNT = '5000'"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("GOMP_SPINCOUNT = '10000'"), std::string::npos) << r.out;  // the user's value kept
}

TEST(Mfu, FlopsPerTokenClosedForm) {
  lt::model::ModelConfig m;
  m.vocabSize = 100, m.hidden = 8, m.layers = 2, m.heads = 2, m.kvHeads = 1, m.intermediate = 16;
  // Per block: 2 norms (16) + q, o (2 x 64) + k, v (2 x 8 x 4) + SwiGLU (3 x 128) = 592; final norm 8.
  // Untied: matmul parameters = 2 x 592 + 8 + the head's 800 (the embedding is a lookup).
  const double attn = 6.0 * 2 * 64 * 8;  // seq_len 64
  EXPECT_DOUBLE_EQ(lt::train::modelFlopsPerToken(m, 64), 6.0 * (2 * 592 + 8 + 800) + attn);
  m.tieEmbeddings = true;  // the table is the head: counted once, as the head
  EXPECT_DOUBLE_EQ(lt::train::modelFlopsPerToken(m, 64), 6.0 * (2 * 592 + 8 + 800) + attn);
}

TEST(Trace, TwoRanksWriteOneChromeTraceWithMfuInTheMetrics) {
  json j = lt::testing::tinyTrainConfig();
  j["train"]["threads"] = 1;
  j["train"]["steps"] = 2;
  j["zero_optimization"] = {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}, {"super_offload", true}}}};
  auto cfg = lt::testing::writeJsonFile("longtrain_speed_test", "trace.json", j);
  auto trace = cfg.parent_path() / "trace.out.json", metrics = cfg.parent_path() / "trace.jsonl";
  auto r = lt::testing::runCommand(std::string(LONGTRAIN_BIN) + " train " + cfg.string() + " --nproc 2 --trace " +
                                   trace.string() + " --metrics " + metrics.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("blas core="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MFU "), std::string::npos) << r.out;
  std::ifstream f(trace);
  const json t = json::parse(f);
  std::set<std::pair<int, std::string>> seen;  // (rank, category)
  std::set<std::string> gemmForms;              // "NT" (forward), "NN" (dx), "TN" (dW)
  const std::regex gemmName("([NT]{2}) [0-9]+x[0-9]+x[0-9]+( \\+=)?");
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "X") {
      seen.insert({e["pid"].get<int>(), e["cat"].get<std::string>()});
      EXPECT_GE(e["dur"].get<int64_t>(), 0);
      if (e["cat"] != "gemm") continue;
      std::smatch m;
      const auto name = e["name"].get<std::string>();
      ASSERT_TRUE(std::regex_match(name, m, gemmName)) << "gemm event named '" << name << "'";
      gemmForms.insert(m[1]);
    }
  for (int rank : {0, 1})
    for (const char* cat : {"program", "collective", "adam", "step", "kernel", "gemm"})
      EXPECT_TRUE(seen.count({rank, cat})) << "rank " << rank << " has no '" << cat << "' event";
  EXPECT_EQ(gemmForms, (std::set<std::string>{"NN", "NT", "TN"})) << "the forward, dx and dW products";
  std::ifstream m(metrics);
  std::string line;
  int lines = 0;
  while (std::getline(m, line)) {
    const json s = json::parse(line);
    EXPECT_GT(s["mfu"].get<double>(), 0);
    EXPECT_LT(s["mfu"].get<double>(), 1);
    EXPECT_DOUBLE_EQ(s["model_flops_per_token"].get<double>(),
                     lt::train::modelFlopsPerToken(lt::config::parseConfig(j, 2).model, 32));
    ++lines;
  }
  EXPECT_EQ(lines, 2);
}

TEST(Mfu, GemmPeakIsMeasured) {
  at::set_num_threads(1);
  const double peak = lt::train::measureGemmPeakFlops();
  EXPECT_GT(peak, 1e9);   // any BLAS does a GFLOP/s
  EXPECT_LT(peak, 1e13);  // one core does not do 10 TFLOP/s of fp32
}

// ---------------------------------------------------------------------------- recompute

struct StepTrace {
  std::vector<double> losses, gradNorms;
  std::vector<at::Tensor> params;
  std::string program;
};

StepTrace trace(const json& j, int world, int sp, int steps) {
  std::vector<StepTrace> out(world);
  lt::testing::runRanks(world, sp, [&](int r, lt::comm::Groups& g) {
    lt::train::Engine e(lt::config::parseConfig(j, world), g);
    for (int s = 0; s < steps; ++s) {
      auto m = e.step();
      out[r].losses.push_back(m.loss);
      out[r].gradNorms.push_back(m.gradNorm);  // a function of every gradient element
    }
    out[r].params = e.fullParameters();
    out[r].program = e.program().listing();
  });
  return out[0];
}

// Kept graphs (no recompute) against full recompute: the same ops on the same values, so
// losses, gradient norms and the parameters after 3 Adam steps agree bit for bit.
void expectRecomputeNeutral(json j, int world, int sp) {
  at::set_num_threads(1);
  j["activation_checkpointing"] = "all";
  const auto all = trace(j, world, sp, 3);
  EXPECT_NE(all.program.find("RecomputeBackward(0)"), std::string::npos) << all.program;
  for (const char* mode : {"none", "auto"}) {
    j["activation_checkpointing"] = mode;
    const auto got = trace(j, world, sp, 3);
    EXPECT_NE(got.program.find("ForwardGraph(1)"), std::string::npos) << mode << "\n" << got.program;
    EXPECT_EQ(got.losses, all.losses) << mode;
    EXPECT_EQ(got.gradNorms, all.gradNorms) << mode;
    ASSERT_EQ(got.params.size(), all.params.size());
    for (size_t i = 0; i < all.params.size(); ++i) EXPECT_TRUE(at::equal(got.params[i], all.params[i])) << mode << " " << i;
  }
}

TEST(ActivationCheckpointing, KeptGraphsBitIdenticalOneRank) {
  json j = lt::testing::tinyTrainConfig();
  j["gradient_clipping"] = 0.5;
  j["gradient_accumulation_steps"] = 2;
  expectRecomputeNeutral(j, 1, 1);
  j["model"]["attention_chunk"] = 8;  // the custom autograd functions too
  j["model"]["tiled_mlp"] = true;
  j["model"]["loss_chunk"] = 8;
  expectRecomputeNeutral(j, 1, 1);
}

TEST(ActivationCheckpointing, KeptGraphsBitIdenticalUnderUlysses) {
  json j = lt::testing::tinyTrainConfig();
  j["sequence_parallel_size"] = 2;
  expectRecomputeNeutral(j, 2, 2);
}

TEST(ActivationCheckpointing, KeptGraphsBitIdenticalUnderZero3AndSuperOffload) {
  json j = lt::testing::tinyTrainConfig();
  j["zero_optimization"] = {{"stage", 3}, {"sub_group_size", 3000},
                            {"offload_optimizer", {{"device", "cpu"}, {"super_offload", true}}}};
  expectRecomputeNeutral(j, 2, 1);
}

TEST(ActivationCheckpointing, AutoKeepsWhatTheBudgetHolds) {
  json j = lt::testing::tinyTrainConfig();
  j["model"]["num_layers"] = 4;
  // Large enough that a kept graph (~8 MiB here) shows above the start-up peak: under a budget
  // (decommitted, as the run below runs) a tiny model's step peaks under it.
  j["model"]["hidden_size"] = 256;
  j["model"]["intermediate_size"] = 512;
  j["data"]["seq_len"] = 512;
  j["train"]["memory_budget"] = "1MiB";  // tight: decommitted, as a budget that binds runs
  auto cfg = lt::config::parseConfig(j, 1);
  const int64_t all = lt::plan::predictPeak(cfg, 1, 0).total(), none = lt::plan::predictPeak(cfg, 1, 4).total();
  ASSERT_LT(all, none);  // each kept graph costs memory
  EXPECT_EQ(lt::plan::graphBlocksFor(cfg, 1, lt::plan::leastBudgetFitting(none)), 4);
  EXPECT_EQ(lt::plan::graphBlocksFor(cfg, 1, lt::plan::leastBudgetFitting(none) - 1), 3);
  EXPECT_LT(lt::plan::graphBlocksFor(cfg, 1, none), 4);  // the peak itself as the budget leaves no margin
  // At the all-recompute peak, as many graphs as leave the peak where it is (keeping the
  // last block's graph can cost nothing when the peak lies in an earlier phase).
  int atAll = 0;
  while (atAll < 4 && lt::plan::predictPeak(cfg, 1, atAll + 1).total() <= all) ++atAll;
  EXPECT_EQ(lt::plan::graphBlocksFor(cfg, 1, lt::plan::leastBudgetFitting(all)), atAll);
  EXPECT_LT(atAll, 4);
  EXPECT_EQ(lt::plan::graphBlocksFor(cfg, 1, all / 2), 0);  // nothing fits: recompute everything
  const int64_t twoBudget = lt::plan::leastBudgetFitting(lt::plan::predictPeak(cfg, 1, 2).total());
  EXPECT_EQ(lt::plan::graphBlocksFor(cfg, 1, twoBudget), 2);
  // The engine takes the choice; its program keeps the last blocks' graphs.
  j["train"]["memory_budget"] = twoBudget;
  std::string program;
  lt::testing::runRanks(1, 1, [&](int, lt::comm::Groups& g) {
    lt::train::Engine e(lt::config::parseConfig(j, 1), g);
    EXPECT_EQ(e.graphBlocks(), 2);
    program = e.program().listing();
  });
  EXPECT_NE(program.find("Forward(1)\nForwardGraph(2)\nForwardGraph(3)"), std::string::npos) << program;
  cfg.activationCheckpointing = lt::config::Recompute::All;
  EXPECT_EQ(lt::plan::graphBlocksFor(cfg, 1, none * 100), 0);
  cfg.activationCheckpointing = lt::config::Recompute::None;
  EXPECT_EQ(lt::plan::graphBlocksFor(cfg, 1, 1), 4);
  j["train"]["memory_budget"] = "1GiB";  // a string with a unit reads too
  EXPECT_EQ(lt::config::parseConfig(j, 1).train.memoryBudget, int64_t{1} << 30);
  j["activation_checkpointing"] = "some";
  EXPECT_NE(lt::testing::errorOf([&] { lt::config::parseConfig(j, 1); })
                .find("'activation_checkpointing' = \"some\" is not one of \"auto\", \"all\", \"none\""),
            std::string::npos);
}

// A budget twice the peak kept without decommit keeps freed spans for reuse (decommitted, a step
// faults every page it frees in again); once the resident set passes kDecommitAtShare of the
// budget's fit after a step (here a buffer the test holds), the run decommits from then on and
// says so. A budget that binds decommits from the start.
TEST(MemoryBudget, AGenerousBudgetKeepsFreedSpansUntilTheResidentSetNearsIt) {
  if (lt::allocatorName() != "tcmalloc") GTEST_SKIP() << "decommit is tcmalloc's";
  // Decommit is process-wide: an earlier test in this process under a budget that binds may
  // have turned it on (ctest runs each test alone; a whole-binary run does not).
  ASSERT_TRUE(lt::keepFreedMemory());
  json j = lt::testing::tinyTrainConfig();
  j["activation_checkpointing"] = "all";
  j["train"]["memory_budget"] = "1MiB";
  EXPECT_TRUE(lt::plan::decommitsFreedMemory(lt::config::parseConfig(j, 1), 1, 0));
  j["train"]["memory_budget"] = 0;
  const int64_t kept = lt::plan::predictPeak(lt::config::parseConfig(j, 1), 1, 0).total();
  const int64_t budget = 3 * lt::plan::leastBudgetFitting(kept);
  j["train"]["memory_budget"] = budget;
  ASSERT_FALSE(lt::plan::decommitsFreedMemory(lt::config::parseConfig(j, 1), 1, 0));
  lt::testing::runRanks(1, 1, [&](int, lt::comm::Groups& g) {
    lt::train::Engine e(lt::config::parseConfig(j, 1), g);
    e.step();
    EXPECT_FALSE(lt::freedMemoryDecommitted());
    const double over = lt::plan::kDecommitAtShare * lt::plan::fitBytes(budget) - lt::currentRssBytes();
    auto held = at::ones({static_cast<int64_t>(std::max(0.0, over)) + (int64_t{64} << 20)}, at::kByte);
    ::testing::internal::CaptureStdout();
    e.step();
    const std::string said = ::testing::internal::GetCapturedStdout();
    EXPECT_TRUE(lt::freedMemoryDecommitted());
    EXPECT_NE(said.find("freed memory goes back to the system from now on"), std::string::npos) << said;
  });
}

// ---------------------------------------------------------------------------- stage-0 Adam

TEST(StageZeroAdam, SkipsAStepWithANonFiniteGradient) {
  at::set_num_threads(1);
  json j = lt::testing::tinyTrainConfig();
  lt::testing::runRanks(1, 1, [&](int, lt::comm::Groups& g) {
    lt::train::Engine e(lt::config::parseConfig(j, 1), g);
    auto params = e.model().parameters();
    std::vector<at::Tensor> before;
    for (const auto& p : params) before.push_back(p.detach().clone());
    // A NaN in the LM head makes the loss and every gradient non-finite.
    params.back().detach()[0][0] = std::numeric_limits<float>::quiet_NaN();
    before.back()[0][0] = std::numeric_limits<float>::quiet_NaN();
    auto m = e.step();
    EXPECT_FALSE(std::isfinite(m.gradNorm));
    EXPECT_TRUE(m.zero.skipped);
    EXPECT_EQ(e.skippedSteps(), 1);
    EXPECT_EQ(e.adamStepCount(), 0);  // Adam's step count did not move ...
    for (size_t i = 0; i + 1 < params.size(); ++i) EXPECT_TRUE(at::equal(params[i], before[i])) << i;  // ... nor did a weight
    for (const auto& s : e.stateShards()) EXPECT_EQ(at::from_blob(s.expAvg, {s.length}).abs().max().item<float>(), 0.0f);
  });
}

}  // namespace
