// plan/fit and plan/time_model: the step's work in closed form (GEMM FLOPs against the model's
// linear layers, attention against causal pairs, the ring's balance), the fit search's promises
// (every choice within the budget, the fastest first, the config's own rules refusing the rest),
// "auto" tiling, and `train --fit` peaking under its budget in a real run.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include "longtrain/config/parse.h"
#include "longtrain/core/memory.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/plan/fit.h"
#include "longtrain/plan/time_model.h"

#include "testing.h"

namespace {

using json = nlohmann::json;
using lt::plan::Rates;
using lt::testing::Tol;

constexpr double kPico = 1e-12;

// A machine in closed form: GEMMs at 1 TFLOP/s (forward 2MNK FLOPs, backward 4MNK), attention at
// 1 TFLOP/s over its causal pairs (QK^T and PV forward, 2.5x that backward), streaming 10 GB/s.
Rates closedFormRates() {
  Rates r;
  r.linearForward = [](int64_t M, int64_t N, int64_t K) { return 2.0 * M * N * K * kPico; };
  r.linearBackward = [](int64_t M, int64_t N, int64_t K) { return 4.0 * M * N * K * kPico; };
  r.attentionForward = [](int64_t B, int64_t S, int64_t h, int64_t, int64_t d) {
    return 4.0 * B * S * (S + 1) / 2 * h * d * kPico;
  };
  r.attentionBackward = [](int64_t B, int64_t S, int64_t h, int64_t, int64_t d) {
    return 10.0 * B * S * (S + 1) / 2 * h * d * kPico;
  };
  r.streamSecondsPerByte = [](double) { return 1e-10; };
  r.opSeconds = 1e-6;
  r.adamSecondsPerElement = 1e-9;
  r.commSecondsPerByte = 1e-9;
  return r;
}

json fitConfig() {
  return json::parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "model": {"vocab_size": 4096, "hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
              "intermediate_size": 352},
    "data": {"seq_len": 2048, "num_samples": 64, "eval_samples": 0,
             "kv": {"num_pairs": 8, "num_queries": 16, "num_keys": 8, "num_values": 8, "num_noise": 16,
                    "fused_pairs": true}},
    "train": {"steps": 2, "threads": 1}
  })");
}

lt::config::Config parse(const json& j, int world, const std::vector<std::string>& sets = {}) {
  json k = j;
  for (const auto& s : sets) lt::config::applyOverride(k, s);
  return lt::config::parseConfig(k, world);
}

// The model's linear weights, counted from its shapes: q, k, v, o, gate, up, down a block, and the head.
double linearWeights(const lt::config::ModelConfig& m, double* head) {
  const double D = m.hidden, d = m.headDim(), I = m.intermediate;
  *head = static_cast<double>(m.vocabSize) * D;
  return static_cast<double>(m.layers) * (D * (m.heads + 2 * m.kvHeads) * d + m.heads * d * D + 3 * D * I);
}

TEST(TimeModel, GemmWorkIsSixFlopsPerWeightPerToken) {
  const auto c = parse(fitConfig(), 1);
  double head = 0;
  const double blocks = linearWeights(c.model, &head);
  const double tokens = static_cast<double>(c.microBatch * c.data.seqLen);
  const auto kept = lt::plan::predictStepTime(c, 1, static_cast<int>(c.model.layers), closedFormRates());
  EXPECT_NEAR(kept.gemm, 6 * (blocks + head) * tokens * kPico, Tol::kDoubleArithmetic * kept.gemm);
  // Full recompute adds each block's forward again: 2 FLOPs a weight a token.
  const auto recomputed = lt::plan::predictStepTime(c, 1, 0, closedFormRates());
  EXPECT_NEAR(recomputed.gemm - kept.gemm, 2 * blocks * tokens * kPico, Tol::kDoubleArithmetic * kept.gemm);
  // Tiles change the GEMMs' shapes, not their work.
  const auto tiled = parse(fitConfig(), 1, {"model.loss_chunk=256", "model.tiled_mlp=true"});
  EXPECT_NEAR(lt::plan::predictStepTime(tiled, 1, 4, closedFormRates()).gemm, kept.gemm, Tol::kDoubleArithmetic * kept.gemm);
  // Accumulation repeats the micro-step.
  const auto twice = parse(fitConfig(), 1, {"gradient_accumulation_steps=2"});
  EXPECT_NEAR(lt::plan::predictStepTime(twice, 1, 4, closedFormRates()).gemm, 2 * kept.gemm, Tol::kDoubleArithmetic * kept.gemm);
}

// Attention is measured at <= 2048 tokens and scaled by causal pairs; the ring splits the pairs,
// and contiguous shards leave the last ring rank with 2 - 1/R times the balanced share.
TEST(TimeModel, AttentionScalesByCausalPairsAndRingBalance) {
  const auto c = parse(fitConfig(), 1, {"data.seq_len=8192"});
  const double S = 8192, pairs = S * (S + 1) / 2, hd = 4.0 * 32;
  const double expected = 14 * pairs * hd * kPico * c.model.layers * c.microBatch;
  const double one = lt::plan::predictStepTime(c, 1, 4, closedFormRates()).attention;
  EXPECT_NEAR(one, expected, Tol::kDoubleArithmetic * expected);
  const auto zig = parse(fitConfig(), 4, {"data.seq_len=8192", "sequence_parallel_size=4",
                                          "sequence_parallel_ring_degree=4", "sequence_parallel_balance=\"zigzag\""});
  const auto con = parse(fitConfig(), 4, {"data.seq_len=8192", "sequence_parallel_size=4",
                                          "sequence_parallel_ring_degree=4", "sequence_parallel_balance=\"contiguous\""});
  const double z = lt::plan::predictStepTime(zig, 4, 4, closedFormRates()).attention;
  EXPECT_NEAR(z, expected / 4, Tol::kDoubleArithmetic * expected);
  EXPECT_NEAR(lt::plan::predictStepTime(con, 4, 4, closedFormRates()).attention, z * (2 - 0.25), Tol::kDoubleArithmetic * expected);
}

// With a block rate (one block timed on the model's code), what a block costs beyond its GEMMs
// and attention is priced per token from it: a block that takes c more seconds a token forward
// (and 2c backward) adds c x tokens x (blocks + recomputed blocks) + 2c x tokens x blocks. The
// pieces' op count is then not charged.
TEST(TimeModel, ABlockTimedOnTheModelPricesItsRestPerToken) {
  constexpr double c = 1e-4;  // far above the closed-form GEMMs and attention a token
  auto withBlock = [](double k) {
    Rates r = closedFormRates();
    r.block = [k](const lt::config::ModelConfig&, int64_t B, int64_t S) {
      return std::make_pair(k * c * B * S, 2 * k * c * B * S);
    };
    return r;
  };
  const auto cfg = parse(fitConfig(), 1);
  const double tokens = static_cast<double>(cfg.microBatch * cfg.data.seqLen), L = cfg.model.layers;
  for (int graphBlocks : {4, 1}) {
    const auto once = lt::plan::predictStepTime(cfg, 1, graphBlocks, withBlock(1));
    const auto twice = lt::plan::predictStepTime(cfg, 1, graphBlocks, withBlock(2));
    const double expected = tokens * c * ((L + (L - graphBlocks)) + 2 * L);
    EXPECT_NEAR(twice.pointwise - once.pointwise, expected, 1e-9 * expected) << graphBlocks << " blocks kept";
    EXPECT_EQ(twice.gemm, once.gemm);
    EXPECT_EQ(twice.attention, once.attention);
    EXPECT_LT(once.overhead, lt::plan::predictStepTime(cfg, 1, graphBlocks, closedFormRates()).overhead);
  }
}

// Under a budget that binds freed pages go back to the system, and a step re-faults what it writes:
// half the bytes its pointwise passes and loss stream (at the closed-form 10 GB/s, pointwise
// seconds / 1e-10). No budget, or one twice the peak kept without decommit: nothing returned.
TEST(TimeModel, DecommitRefaultsWhatAStepWrites) {
  Rates r = closedFormRates();
  r.refaultSecondsPerByte = 3e-10;
  EXPECT_EQ(lt::plan::predictStepTime(parse(fitConfig(), 1), 1, 4, r).decommit, 0);
  const auto generous = parse(fitConfig(), 1, {"train.memory_budget=\"1GiB\""});
  const int64_t kept = lt::plan::predictPeak(parse(fitConfig(), 1), 1, 4).total();
  ASSERT_LT(kept, lt::plan::kKeepFreedShare * lt::plan::fitBytes(int64_t{1} << 30));
  EXPECT_FALSE(lt::plan::decommitsFreedMemory(generous, 1, 4));
  EXPECT_EQ(lt::plan::predictStepTime(generous, 1, 4, r).decommit, 0);
  const auto budgeted = parse(fitConfig(), 1, {"train.memory_budget=\"1MiB\""});
  EXPECT_EQ(lt::plan::decommitsFreedMemory(budgeted, 1, 4), lt::allocatorName() == "tcmalloc");
  const auto t = lt::plan::predictStepTime(budgeted, 1, 4, r);
  EXPECT_NEAR(t.decommit, 0.5 * t.pointwise / 1e-10 * 3e-10, Tol::kDoubleArithmetic * t.decommit);
  EXPECT_NEAR(t.total() - t.decommit, lt::plan::predictStepTime(parse(fitConfig(), 1), 1, 4, r).total(),
              Tol::kDoubleArithmetic * t.total());
}

// Across nodes a collective is priced by where its group's ranks sit (4 ranks, 2 a node, the link
// 8x slower than loopback): a group inside a node moves at loopback; a ring that spans the nodes
// waits for its hop across, once per spanning group on the node; an all-to-all sends its off-node
// share (2 of 3 peers) over a link both of the node's ranks use at once.
TEST(TimeModel, CollectivesArePricedByWhereTheirRanksSit) {
  using lt::plan::Pattern;
  Rates r = closedFormRates();
  r.linkSecondsPerByte = 8 * r.commSecondsPerByte;
  const lt::plan::Placement two{4, 2};
  const double intra = r.commSecondsPerByte, link = r.linkSecondsPerByte;
  EXPECT_DOUBLE_EQ(lt::plan::collectiveSecondsPerByte({{0, 1}, {2, 3}}, Pattern::AllToAll, two, r), intra);
  EXPECT_DOUBLE_EQ(lt::plan::collectiveSecondsPerByte({{0, 1, 2, 3}}, Pattern::Ring, two, r), link);
  EXPECT_DOUBLE_EQ(lt::plan::collectiveSecondsPerByte({{0, 2}, {1, 3}}, Pattern::Ring, two, r), 2 * link);
  EXPECT_DOUBLE_EQ(lt::plan::collectiveSecondsPerByte({{0, 1, 2, 3}}, Pattern::AllToAll, two, r), 2.0 / 3 * 2 * link);
  EXPECT_DOUBLE_EQ(lt::plan::collectiveSecondsPerByte({{0, 1, 2, 3}}, Pattern::AllToAll,
                                                      lt::plan::Placement::oneNode(4), r), intra);
  // The layout's groups, as comm::makeGroups forms them: SP 4 = Ulysses 2 x ring 2.
  const auto c = parse(fitConfig(), 4, {"sequence_parallel_size=4", "sequence_parallel_ring_degree=2"});
  EXPECT_EQ(c.layout.ulyssesGroups(), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(c.layout.ringGroups(), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  // A step: Ulysses 4 over both nodes exposes its all-to-alls at the link's rate. Compute slow enough
  // to hide ZeRO's all-reduce leaves them the step's only communication.
  Rates slow = r;
  slow.linearForward = [](int64_t M, int64_t N, int64_t K) { return 2e3 * M * N * K * kPico; };
  const auto u4 = parse(fitConfig(), 4, {"sequence_parallel_size=4"});
  ASSERT_EQ(u4.layout.U, 4);
  const double T = 2 * 2048 / 4, qkvo = (4 + 2 * 2 + 4) * 32, L = 4;
  const double bytes = L * 2 * T * qkvo * 4 * 3 / 4;  // forward and backward, 3/4 of each rank's rows leave it
  const auto across = lt::plan::predictStepTime(u4, two, 4, slow);
  EXPECT_NEAR(across.comm, bytes * 2.0 / 3 * 2 * link, Tol::kDoubleArithmetic * across.comm);
  EXPECT_NEAR(lt::plan::predictStepTime(u4, 4, 4, slow).comm, bytes * intra, Tol::kDoubleArithmetic * bytes * intra);
}

// A budget between the smallest and the largest candidate: some fit, some do not; every one that
// fits is within the budget less the margin, re-parses from its own --set list, and the list is
// fastest first.
TEST(Fit, EveryChoiceFitsTheBudgetAndTheFastestComesFirst) {
  const json j = fitConfig();
  const int world = 2;
  auto with = [&](const std::vector<std::string>& sets) { return parse(j, world, sets); };
  const auto base = parse(j, world);
  // Priced as fit prices its candidates: under a budget that binds (freed spans decommitted).
  const std::string budgeted = "train.memory_budget=\"1MiB\"";
  const int64_t small = lt::plan::predictPeak(parse(j, world, {"model.loss_chunk=256", "model.tiled_mlp=true",
                                                                "zero_optimization.stage=3", "sequence_parallel_size=2",
                                                                budgeted}),
                                              world, 0).total();
  const int64_t large = lt::plan::predictPeak(parse(j, world, {budgeted}), world, 4).total();
  ASSERT_LT(small, large);
  const int64_t budget = (small + large) / 2;
  const auto r = lt::plan::fit(base, with, lt::plan::Placement::oneNode(world), budget, closedFormRates());
  ASSERT_FALSE(r.fitting.empty());
  EXPECT_GT(r.tooBig, 0);
  EXPECT_GT(r.invalid, 0);  // batch splits meant for the other SP degree
  EXPECT_EQ(r.considered, r.invalid + r.tooBig + static_cast<int>(r.fitting.size()));
  for (size_t i = 0; i < r.fitting.size(); ++i) {
    const auto& c = r.fitting[i];
    EXPECT_LE(c.peak.total(), (1 - lt::plan::kFitMargin) * static_cast<double>(budget)) << c.describe();
    if (i > 0) {
      EXPECT_LE(r.fitting[i - 1].time.total(), c.time.total());
    }
    const auto again = with(c.sets);
    EXPECT_EQ(again.sequenceParallelSize, c.cfg.sequenceParallelSize);
    EXPECT_EQ(again.zero.stage, c.cfg.zero.stage);
    EXPECT_EQ(again.model.lossChunk, c.cfg.model.lossChunk);
    EXPECT_EQ(again.microBatch * again.gradAccum * again.layout.dp, base.trainBatchSize) << c.describe();
  }
  // Nothing fits below the smallest candidate.
  EXPECT_TRUE(lt::plan::fit(base, with, lt::plan::Placement::oneNode(world), small / 2, closedFormRates()).fitting.empty());
}

// On two nodes a slow link keeps the all-to-alls inside a node: no choice that fits puts a Ulysses
// group across the link ahead of one that does not (the same config otherwise).
TEST(Fit, ASlowLinkKeepsUlyssesInsideANode) {
  const json j = fitConfig();
  const int world = 4;
  auto with = [&](const std::vector<std::string>& sets) { return parse(j, world, sets); };
  Rates r = closedFormRates();
  r.linkSecondsPerByte = 100 * r.commSecondsPerByte;
  const lt::plan::Placement two{world, 2};
  const auto f = lt::plan::fit(parse(j, world), with, two, int64_t{8} << 30, r);
  ASSERT_FALSE(f.fitting.empty());
  EXPECT_LE(f.fitting.front().cfg.layout.U, 2) << f.fitting.front().describe();
  // SP 4 as Ulysses 4 (its all-to-alls span the link) against Ulysses 2 x ring 2 (they stay in a
  // node), everything else the same: the first is slower on two nodes, not on one.
  int pairs = 0;
  for (const auto& a : f.fitting)
    for (const auto& b : f.fitting) {
      if (a.cfg.layout.U != 4 || b.cfg.layout.U != 2 || b.cfg.layout.R != 2 || b.cfg.layout.zigzag) continue;
      if (a.cfg.zero.stage != b.cfg.zero.stage || a.cfg.model.lossChunk != b.cfg.model.lossChunk ||
          a.cfg.model.tiledMlp != b.cfg.model.tiledMlp || a.cfg.microBatch != b.cfg.microBatch)
        continue;
      ++pairs;
      EXPECT_GT(a.time.comm, b.time.comm) << a.describe() << " against " << b.describe();
    }
  EXPECT_GT(pairs, 0) << "no Ulysses 4 candidate fit to compare";
}

TEST(Fit, AutoTilingTilesOnlyWhatTheBudgetNeeds) {
  const json j = fitConfig();
  const auto c = parse(j, 1, {"model.loss_chunk=\"auto\"", "model.tiled_mlp=\"auto\"", "data.seq_len=8192",
                              "activation_checkpointing=\"all\""});
  EXPECT_TRUE(c.model.lossChunkAuto);
  EXPECT_TRUE(c.model.tiledMlpAuto);
  const auto roomy = lt::plan::chooseTiling(c, 1, int64_t{1} << 40);
  EXPECT_EQ(roomy.lossChunk, 0);
  EXPECT_FALSE(roomy.tiledMlp);
  // Just above the fully tiled peak: only full tiling fits.
  const int64_t tight = lt::plan::predictPeak(parse(j, 1, {"model.loss_chunk=256", "model.tiled_mlp=true",
                                                          "data.seq_len=8192", "activation_checkpointing=\"all\""}),
                                              1, 0).total() + (1 << 20);
  const auto t = lt::plan::chooseTiling(c, 1, tight);
  EXPECT_EQ(t.lossChunk, 256);
  EXPECT_TRUE(t.tiledMlp);
  // A key the user set keeps its value.
  const auto fixed = parse(j, 1, {"model.loss_chunk=512", "model.tiled_mlp=\"auto\"", "data.seq_len=8192",
                                  "activation_checkpointing=\"all\""});
  EXPECT_EQ(lt::plan::chooseTiling(fixed, 1, tight).lossChunk, 512);
  EXPECT_NE(lt::testing::errorOf([&] { parse(j, 1, {"model.loss_chunk=\"most\""}); }), "");
}

const std::string kBin = LONGTRAIN_BIN;

lt::testing::CommandResult sh(const std::string& cmd) { return lt::testing::runCommand(cmd); }

std::string writeJson(const std::string& name, const json& j) {
  return lt::testing::writeJsonFile("longtrain_fit_test", name, j).string();
}

// `longtrain ARGS` exits 1 with `message` in its output.
void expectRefused(const std::string& args, const std::string& message) {
  const auto r = sh(kBin + " " + args);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(message), std::string::npos) << r.out;
}

// `plan --nnodes` needs the link's rate and prints the launch across nodes.
TEST(Fit, PlanAcrossNodesNeedsTheLinkAndPlacesTheRanks) {
  const std::string cfg = writeJson("nodes.json", fitConfig());
  expectRefused("plan " + cfg + " --nnodes 2 --nproc 2 --fit 2GiB", "needs --link-bandwidth");
  expectRefused("plan " + cfg + " --nnodes 2 --nproc 2 --link-bandwidth 10GB --fit 2GiB",
                "--link-bandwidth: cannot read '10GB' as a link rate");
  const auto p = sh(kBin + " plan " + cfg + " --nnodes 2 --nproc 2 --link-bandwidth 1Gbit/s --fit 2GiB");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("fit: 2 nodes x 2 ranks, the link between nodes at 1 Gbit/s"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("--nnodes 2 --nproc-per-node 2 --set"), std::string::npos) << p.out;
  expectRefused("train " + cfg + " --link-bandwidth 1gbit", "without --fit and --nnodes above 1 it does nothing");
  expectRefused("plan " + cfg + " --link-bandwidth 1gbit --fit 2GiB", "with one node it does nothing");
}

// `plan --fit` prints its choice, the runners-up and what it left out; `train --fit` runs the
// choice and peaks under the budget, and on 2 ranks gives every rank the launcher's choice and
// peaks under it too. The budget: the fully tiled, recomputed peak (which the config's untiled default
// exceeds) plus 25%. Then "auto" tiling in a run.
TEST(Fit, TrainFitRunsItsChoiceUnderTheBudget) {
  json j = fitConfig();
  j["model"]["vocab_size"] = 16384;
  const std::string cfg = writeJson("fit.json", j);
  const auto p = sh(kBin + " plan " + cfg + " --nproc 2 --fit 2GiB");
  ASSERT_EQ(p.code, 0) << p.out;
  for (const char* k : {"fit: ", "chosen: ", "runners-up:", "not considered: SuperOffload", "tokens/s"})
    EXPECT_NE(p.out.find(k), std::string::npos) << k << "\n" << p.out;
  expectRefused("plan " + cfg + " --nproc 2 --fit 1MiB", "nothing fits 1 MiB a rank");
  expectRefused("train " + cfg + " --fit 12XB", "--fit: cannot read '12XB'");
  const std::string metrics = cfg + "l";  // fit.jsonl beside it
  const auto peakOf = [&] {
    std::ifstream f(metrics);
    std::string line;
    double peak = 0;
    while (std::getline(f, line)) peak = std::max(peak, json::parse(line)["peak_rss_bytes"].get<double>());
    return peak;
  };
  // The fully tiled, recomputed peak on `ranks` ranks, as plan predicts it under a budget (MiB).
  const auto tiledPeak = [&](int ranks) {
    const auto probe = sh(kBin + " plan " + cfg + " --nproc " + std::to_string(ranks) +
                          " --set model.loss_chunk=256 --set model.tiled_mlp=true --set activation_checkpointing='\"all\"'"
                          " --set train.memory_budget='\"1GiB\"'");
    EXPECT_EQ(probe.code, 0) << probe.out;
    const auto at = probe.out.find("total");
    return at == std::string::npos ? 0.0 : std::stod(probe.out.substr(at + 5));
  };
  // The budget's promise, on one rank, where the memory model's accuracy table holds.
  const int64_t budgetMiB = static_cast<int64_t>(1.25 * tiledPeak(1));
  const auto r = sh(kBin + " train " + cfg + " --fit " + std::to_string(budgetMiB) + "MiB --metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("chosen: "), std::string::npos) << r.out;
  EXPECT_LE(peakOf(), static_cast<double>(budgetMiB) * (1 << 20)) << r.out;
  // On 2 ranks the launcher chooses once and its ranks run the choice (their banner names the SP
  // degree the choice names), every rank under the budget (the metrics' peak: the most of any rank).
  const double tiled2 = tiledPeak(2);
  const int64_t budget2 = static_cast<int64_t>(1.25 * tiled2);
  std::remove(metrics.c_str());
  const auto two = sh(kBin + " train " + cfg + " --nproc 2 --set train.steps=1 --fit " + std::to_string(budget2) +
                      "MiB --metrics " + metrics);
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_LE(peakOf(), static_cast<double>(budget2) * (1 << 20)) << two.out;
  const auto chosen = two.out.find("chosen: ");
  ASSERT_NE(chosen, std::string::npos) << two.out;
  const bool sp = two.out.compare(chosen + 8, 5, "no SP") != 0;
  EXPECT_NE(two.out.find(sp ? "(sp=2:" : "(sp=1"), std::string::npos) << two.out;
  // "auto" tiling in a run, with every block recomputed so that only the tiling decides: at 2%
  // over the fully tiled peak, only full tiling fits.
  const int64_t tightMiB = static_cast<int64_t>(1.02 * tiled2);
  const auto a = sh(kBin + " train " + cfg + " --nproc 2 --set train.steps=1 --set model.loss_chunk='\"auto\"' "
                    "--set model.tiled_mlp='\"auto\"' --set activation_checkpointing='\"all\"' "
                    "--set train.memory_budget=" + std::to_string(tightMiB) + "MiB");
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("\"auto\" tiling against " + std::to_string(tightMiB) +
                       " MiB a rank: model.loss_chunk 256, model.tiled_mlp true"),
            std::string::npos) << a.out;
}

}  // namespace
