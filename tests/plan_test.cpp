// plan/: the memory model's algebra (parts add up, ZeRO-3 partitions, growth in seq_len), the
// budget search, byte-size parsing, the `plan` command, and one prediction against the
// peak RSS a real run measures (a subprocess: VmHWM is per process and never falls).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "longtrain/core/check.h"
#include "longtrain/core/strings.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/config/parse.h"

#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using lt::plan::predictPeak;

json planConfig() {
  return json::parse(R"({
    "train_micro_batch_size_per_gpu": 1,
    "model": {"vocab_size": 4096, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 256},
    "data": {"seq_len": 1024, "num_samples": 64, "eval_samples": 0,
             "kv": {"num_pairs": 8, "num_queries": 16, "num_keys": 8, "num_values": 8, "num_noise": 16,
                    "fused_pairs": true}},
    "train": {"steps": 2}
  })");
}

lt::config::Config parse(const json& j, int world, const std::vector<std::string>& sets = {}) {
  json k = j;
  for (const auto& s : sets) lt::config::applyOverride(k, s);
  return lt::config::parseConfig(k, world);
}

lt::config::Config withSeq(lt::config::Config c, int64_t s) {
  c.data.seqLen = s;
  return c;
}

// The persistent parts in closed form from the parameter count N (ModelConfig::numParams, the
// model's own count): stage 0 on one rank holds 4N bytes each of parameters and gradients
// and 8N of Adam state; ZeRO-3 on 4 ranks a quarter of each, plus SuperOffload's 12-byte
// shadows of the offloaded quarter and the gathered block at the peak.
TEST(Plan, PersistentPartsInClosedForm) {
  auto c = parse(planConfig(), 1);
  const int64_t N = c.model.numParams();
  auto m = predictPeak(c, 1);
  EXPECT_EQ(m.parameters, 4 * N);
  EXPECT_EQ(m.gradients, 4 * N);
  EXPECT_EQ(m.optimizer, 8 * N);
  auto z = parse(planConfig(), 4, {"zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=cpu",
                                   "zero_optimization.offload_optimizer.super_offload=true"});
  const auto state = lt::plan::modelState(z, 4);
  EXPECT_EQ(state.parameters, N);  // 4N / 4
  EXPECT_EQ(state.gradients, N);
  EXPECT_EQ(state.optimizer, 2 * N + 3 * N);  // m, v and the shadows (master, m, v) of a quarter
  // Under bf16 GEMMs the masters carry bf16 copies for the gathers (2 bytes each), unless
  // bf16.gathers is off.
  auto b = z;
  b.model.resolved.bf16Gemms = true;  // what the engine (and `longtrain plan`) sets when bf16 is chosen
  EXPECT_EQ(lt::plan::modelState(b, 4).parameters, N + 2 * N / 4);
  b.precision.gathers = false;
  EXPECT_EQ(lt::plan::modelState(b, 4).parameters, N);
}

TEST(Plan, PartsAreNonNegativeAndNamed) {
  for (const auto& sets : std::vector<std::vector<std::string>>{
           {}, {"model.attention_chunk=128", "model.loss_chunk=256", "model.tiled_mlp=true"},
           {"zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=cpu",
            "zero_optimization.offload_optimizer.super_offload=true"}}) {
    auto m = predictPeak(parse(planConfig(), 1, sets), 1);
    for (int64_t part : {m.baseline, m.parameters, m.gradients, m.optimizer, m.activations, m.transient, m.retained})
      EXPECT_GE(part, 0);
    EXPECT_FALSE(m.phase.empty());
  }
}

TEST(Plan, ZeroThreeStateScalesAsOneOverWorld) {
  auto z3 = parse(planConfig(), 4, {"zero_optimization.stage=3"});
  auto one = lt::plan::modelState(z3, 1), four = lt::plan::modelState(z3, 4);
  const int64_t n = z3.model.numParams();
  EXPECT_EQ(one.parameters, 4 * n);
  EXPECT_EQ(one.gradients, 4 * n);
  EXPECT_EQ(one.optimizer, 8 * n);
  EXPECT_NEAR(four.parameters, one.parameters / 4.0, 1);
  EXPECT_NEAR(four.gradients, one.gradients / 4.0, 1);
  EXPECT_NEAR(four.optimizer, one.optimizer / 4.0, 1);
  // Stage 0 replicates the state on every rank.
  auto z0 = parse(planConfig(), 4);
  EXPECT_EQ(lt::plan::modelState(z0, 4).optimizer, lt::plan::modelState(z0, 1).optimizer);
  // The predicted peak itself falls with the world under ZeRO-3.
  EXPECT_LT(predictPeak(z3, 4).total(), predictPeak(z3, 1).total());
}

// (peak(4S) - peak(2S)) / (peak(2S) - peak(S)): ~4 for a quadratic term, ~2 for linear.
double growth(const lt::config::Config& c, int64_t s) {
  auto p = [&](int64_t len) { return static_cast<double>(predictPeak(withSeq(c, len), 1).total()); };
  return (p(4 * s) - p(2 * s)) / (p(2 * s) - p(s));
}

TEST(Plan, NaiveAttentionGrowsQuadraticallyChunkedAndFusedLinearly) {
  auto naive = parse(planConfig(), 1, {"model.vocab_size=100", "model.attention=naive"});
  EXPECT_GT(growth(naive, 2048), 3.5);
  for (const char* kind : {"chunked", "fused"}) {
    auto c = parse(planConfig(), 1, {"model.vocab_size=100", std::string("model.attention=") + kind});
    const double g = growth(c, 2048);
    EXPECT_GT(g, 1.8) << kind;
    EXPECT_LT(g, 2.2) << kind;
  }
  // The fused kernel holds only the log-sum-exp beyond what the block saves anyway.
  auto fused = parse(planConfig(), 1, {"model.vocab_size=100"}), chunked = fused;
  chunked.model.attention = lt::config::AttentionKernel::Chunked;
  EXPECT_LT(predictPeak(withSeq(fused, 8192), 1).total(), predictPeak(withSeq(chunked, 8192), 1).total());
}

TEST(Plan, MaxSeqIsMonotoneInBudgetAndTight) {
  auto c = parse(planConfig(), 2, {"sequence_parallel_size=2", "model.attention_chunk=256", "model.loss_chunk=256"});
  int64_t prev = 0;
  for (int mib = 200; mib <= 1200; mib += 100) {
    const int64_t budget = int64_t{mib} << 20;
    const int64_t s = lt::plan::maxSeqLen(c, 2, budget);
    EXPECT_GE(s, prev) << mib << " MiB";
    prev = s;
    if (s == 0) continue;
    EXPECT_EQ(s % 2, 0);
    const auto runAt = [&](int64_t seq) {  // as the run at that length runs: under the budget
      auto r = withSeq(c, seq);
      r.train.memoryBudget = budget;
      return predictPeak(r, 2).total();
    };
    EXPECT_LE(runAt(s), lt::plan::fitBytes(budget));  // the margin kept free
    EXPECT_GT(runAt(s + 2), lt::plan::fitBytes(budget));
  }
  EXPECT_GT(prev, 0);
  // Below the process baseline nothing fits.
  EXPECT_EQ(lt::plan::maxSeqLen(c, 2, int64_t{64} << 20), 0);
}

TEST(Plan, AblationLadderAddsOneOptionPerRung) {
  auto c = parse(planConfig(), 1, {"model.num_heads=2", "model.num_kv_heads=2"});
  auto ladder = lt::plan::ablationLadder(c);
  ASSERT_EQ(ladder.size(), 8u);
  EXPECT_EQ(ladder[0].cfg.model.attention, lt::config::AttentionKernel::Naive);
  EXPECT_EQ(ladder[0].cfg.model.lossChunk, 0);
  EXPECT_GT(ladder[1].cfg.model.lossChunk, 0);
  EXPECT_EQ(ladder[1].cfg.model.attention, lt::config::AttentionKernel::Naive);
  EXPECT_EQ(ladder[2].cfg.model.attention, lt::config::AttentionKernel::Fused);
  EXPECT_TRUE(ladder[3].cfg.model.tiledMlp);
  EXPECT_EQ(ladder[4].world, 2);
  EXPECT_TRUE(ladder[4].skipped.empty());
  // SP 4 on 2 heads: Ulysses 2 x ring 2 (DeepSpeed's Ulysses stops at the head count).
  EXPECT_TRUE(ladder[5].skipped.empty());
  EXPECT_EQ(ladder[5].cfg.layout.describe(), "Ulysses 2 x ring 2, zigzag");
  EXPECT_EQ(ladder[7].world, 8);
  EXPECT_EQ(ladder[7].cfg.layout.R, 4);
  EXPECT_EQ(ladder[6].cfg.zero.stage, 3);
  EXPECT_TRUE(ladder[6].cfg.zero.offloadOptimizer.superOffload);
  // Each rung fits at least as long a sequence as the one before, at the same budget.
  int64_t prev = 0;
  for (int i = 0; i < 6; ++i) {
    const int64_t s = lt::plan::maxSeqLen(ladder[i].cfg, ladder[i].world, int64_t{400} << 20);
    EXPECT_GE(s, prev) << ladder[i].name;
    prev = s;
  }
}

TEST(Plan, ParseBytes) {
  using lt::plan::parseBytes;
  EXPECT_EQ(parseBytes("4GiB"), int64_t{4} << 30);
  EXPECT_EQ(parseBytes("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parseBytes("512mib"), int64_t{512} << 20);
  EXPECT_EQ(parseBytes("2G"), int64_t{2} << 30);
  EXPECT_EQ(parseBytes("1.5GB"), 1500000000);
  EXPECT_EQ(parseBytes("1000000"), 1000000);
  EXPECT_EQ(parseBytes("64KiB"), 65536);
  for (const std::string bad : {"", "lots", "12XB", "-5MiB", "0", "1.2.3GiB", "GiB"}) {
    try {
      parseBytes(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const lt::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--max-seq: cannot read '" + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("e.g. 4GiB"), std::string::npos) << msg;
    }
  }
}

// Link rates: bits as tc writes them, bytes a second with an uppercase B and "/s"; what could be
// either is refused, naming both spellings.
TEST(Plan, ParseLinkRate) {
  using lt::parseLinkRate;
  EXPECT_DOUBLE_EQ(parseLinkRate("10Gbit/s", "r"), 1.25e9);
  EXPECT_DOUBLE_EQ(parseLinkRate("1gbit", "r"), 1.25e8);
  EXPECT_DOUBLE_EQ(parseLinkRate("100Mbit", "r"), 1.25e7);
  EXPECT_DOUBLE_EQ(parseLinkRate("1.25GB/s", "r"), 1.25e9);
  EXPECT_DOUBLE_EQ(parseLinkRate("100MiB/s", "r"), 100.0 * (1 << 20));
  for (const std::string bad : {"", "fast", "10Gb/s", "10gb/s", "1GB", "10GB", "3Xbit", "0gbit", "1.2.3GB/s", "GB/s"}) {
    try {
      parseLinkRate(bad, "--link-bandwidth");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const lt::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--link-bandwidth: cannot read '" + bad + "' as a link rate"), std::string::npos) << msg;
    }
  }
  try {
    parseLinkRate("10Gb/s", "r");
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("write Gbit/s for bits, GB/s for bytes"), std::string::npos) << e.what();
  }
}

using Result = lt::testing::CommandResult;
Result sh(const std::string& cmd) { return lt::testing::runCommand(cmd); }

fs::path writeConfig(const std::string& name, const json& j) {
  return lt::testing::writeJsonFile("longtrain_plan_test", name, j);
}

const std::string kBin = LONGTRAIN_BIN;

TEST(Plan, CommandPrintsBreakdownAndLadder) {
  auto cfg = writeConfig("plan.json", planConfig()).string();
  auto r = sh(kBin + " plan " + cfg + " --set model.attention_chunk=128");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* k : {"baseline (process)", "parameters", "gradients", "optimizer states", "kept activations",
                        "transient", "allocator retained", "total", "fits a budget of"})
    EXPECT_NE(r.out.find(k), std::string::npos) << k << "\n" << r.out;
  auto m = sh(kBin + " plan " + cfg + " --max-seq 1GiB");
  ASSERT_EQ(m.code, 0) << m.out;
  for (const char* k : {"longest seq_len", "1 baseline", "2 + tiled logits-loss", "3 + fused attention",
                        "4 + tiled MLP", "5 + SP=2", "6 + SP=4", "7 + ZeRO-3 + SuperOffload",
                        "zero_optimization.offload_optimizer.super_offload=true"})
    EXPECT_NE(m.out.find(k), std::string::npos) << k << "\n" << m.out;
  auto bad = sh(kBin + " plan " + cfg + " --max-seq 12XB");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("cannot read '12XB'"), std::string::npos) << bad.out;
}

// Tolerance of the prediction against the measured peak RSS: the issue's goal. The README's
// validation table shows the errors over 13 configs; this one measured 420.1-420.4 MiB in
// three runs against 418.5 predicted. (Configs dominated by small blocks vary more from run
// to run: one measured 288-318 MiB, the allocator's heap growing in some runs.)
constexpr double kPredictionTol = 0.10;

double measuredPeak(const json& j, const std::string& name) {
  auto cfg = writeConfig(name + ".json", j);
  auto metrics = cfg.parent_path() / (name + ".jsonl");
  auto r = sh(kBin + " train " + cfg.string() + " --metrics " + metrics.string());
  EXPECT_EQ(r.code, 0) << r.out;
  std::ifstream f(metrics);
  std::string line;
  double measured = 0;
  while (std::getline(f, line)) measured = std::max(measured, json::parse(line)["peak_rss_bytes"].get<double>());
  return measured;
}

// A run whose tensors are < 1 MiB: its peak is the process baseline, on this build and allocator.
json tinyConfig() {
  json tiny = planConfig();
  tiny["model"] = {{"vocab_size", 64}, {"hidden_size", 32}, {"num_layers", 2}, {"num_heads", 4}, {"intermediate_size", 48}};
  tiny["data"]["kv"] = {{"num_pairs", 4}, {"num_queries", 4}, {"num_keys", 16}, {"num_values", 8}, {"num_noise", 8}};
  tiny["data"]["seq_len"] = 64;
  tiny["train"]["threads"] = 1;
  return tiny;
}

int64_t measuredPeakOfTiny() { return static_cast<int64_t>(measuredPeak(tinyConfig(), "baseline")); }

TEST(Plan, PredictionMatchesMeasuredPeakRss) {
  // The process baseline is measured here by a tiny run; the model's stand-in (no process has
  // measured one in this test binary) is checked against it separately.
  const json tiny = tinyConfig();
  const double baseline = measuredPeak(tiny, "baseline");
  const double modelBaseline = static_cast<double>(predictPeak(parse(tiny, 1), 1).baseline);
  std::printf("plan: baseline measured %.1f MiB, the model's %.1f MiB\n", baseline / (1 << 20), modelBaseline / (1 << 20));
  EXPECT_LE(std::abs(modelBaseline - baseline) / baseline, kPredictionTol);
  // Two blocks, fused attention (tile 256) and logits in tiles of 256 tokens at 8192 tokens: ~200 MiB
  // of working set over the baseline; graphs kept ("none") and recomputed ("all"). (Naive
  // attention's [B, H, S, S] blocks are under-predicted by up to 12% under tcmalloc: the
  // README's accuracy table.)
  json j = planConfig();
  j["model"]["loss_chunk"] = 256;
  j["model"]["attention_chunk"] = 256;
  j["model"]["vocab_size"] = 8192;
  j["data"]["seq_len"] = 8192;
  j["train"]["threads"] = 1;
  for (const char* mode : {"all", "none"}) {
    j["activation_checkpointing"] = mode;
    const double measured = measuredPeak(j, std::string("measure-") + mode);
    const auto m = predictPeak(parse(j, 1), 1, std::string(mode) == "none" ? 2 : 0);
    const double predicted = baseline + static_cast<double>(m.total() - m.baseline);
    const double err = (predicted - measured) / measured;
    std::printf("plan (%s): predicted %.1f MiB, measured %.1f MiB, error %+.1f%%\n", mode, predicted / (1 << 20),
                measured / (1 << 20), 100 * err);
    EXPECT_LE(std::abs(err), kPredictionTol) << mode;
  }
}

}  // namespace

namespace {

// `plan --max-seq BUDGET`'s longest seq_len and the peak a 1-step run at it measures (VmHWM).
struct FitCheck {
  int64_t seqLen = 0;
  double peak = 0;
};

FitCheck runAtMaxSeq(const json& j, int64_t budgetMiB) {
  const std::string name = "fit-" + std::to_string(budgetMiB);
  auto cfg = writeConfig(name + ".json", j).string();
  auto p = sh(kBin + " plan " + cfg + " --max-seq " + std::to_string(budgetMiB) + "MiB");
  EXPECT_EQ(p.code, 0) << p.out;
  FitCheck out;
  const auto at = p.out.find("longest seq_len ");
  if (at == std::string::npos) return out;
  out.seqLen = std::stoll(p.out.substr(at + 16));
  json run = j;
  run["data"]["seq_len"] = out.seqLen;
  run["train"]["memory_budget"] = std::to_string(budgetMiB) + "MiB";
  out.peak = measuredPeak(run, name);
  return out;
}

}  // namespace

// The plan's promise: a run at the longest seq_len `plan --max-seq BUDGET` names peaks under
// BUDGET. A model whose memory grows fast in seq_len (whole logits of a 8192 vocabulary) keeps
// the lengths short and the runs quick; budgets 80 to 230 MiB over the baseline (its model state
// is 42 MiB).
TEST(Plan, RunAtMaxSeqPeaksUnderBudget) {
  json j = planConfig();
  j["model"] = {{"vocab_size", 8192}, {"hidden_size", 128}, {"num_layers", 2}, {"num_heads", 4},
                {"intermediate_size", 512}};
  j["train"]["steps"] = 1;
  j["train"]["threads"] = 1;
  const int64_t base = measuredPeakOfTiny() / (1 << 20);
  int64_t previous = 0;
  for (int64_t over : {80, 130, 230}) {
    const int64_t budget = base + over;
    const FitCheck f = runAtMaxSeq(j, budget);
    ASSERT_GT(f.seqLen, previous) << "budget " << budget << " MiB";
    std::printf("plan --max-seq %lld MiB: seq_len %lld, measured peak %.1f MiB\n", (long long)budget,
                (long long)f.seqLen, f.peak / (1 << 20));
    EXPECT_LE(f.peak, static_cast<double>(budget) * (1 << 20)) << "seq_len " << f.seqLen;
    previous = f.seqLen;
  }
}
