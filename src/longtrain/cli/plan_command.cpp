// `longtrain plan` (each rank's predicted peak memory, or the longest seq_len within a budget and
// the ablation ladder's) and `longtrain config` (the config checked as train checks it, printed
// with every default). Both read a config and train nothing. Non-obvious: plan assumes bf16 GEMMs
// when bf16.enabled, while a run measures and may fall back to fp32 (plan says so); and the
// process baseline is measured by a run of this binary (train/process_baseline.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "longtrain/cli/command.h"
#include "longtrain/config/parse.h"
#include "longtrain/config/run_plan.h"
#include "longtrain/core/check.h"
#include "longtrain/core/strings.h"
#include "longtrain/model/model.h"
#include "longtrain/plan/fit.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/plan/time_model.h"
#include "longtrain/train/machine.h"
#include "longtrain/train/measured_rates.h"
#include "longtrain/train/process_baseline.h"

namespace lt::cli {

namespace {

struct ConfigFlags {
  std::string config, maxSeq, fit, linkBandwidth;
  int nproc = 0, nnodes = 1;
  std::vector<std::string> sets;
  bool print = false;
};

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

// `budgeted`: the same layout's total under a train.memory_budget (allocator decommits freed spans).
void printBreakdown(const plan::MemoryBreakdown& m, int64_t budgeted) {
  std::printf("per-rank peak (MiB), at %s:\n", m.phase.c_str());
  const std::pair<const char*, int64_t> rows[] = {
      {"baseline (process)", m.baseline}, {"parameters", m.parameters}, {"gradients", m.gradients},
      {"optimizer states", m.optimizer},  {"kept activations", m.activations}, {"transient", m.transient},
      {"allocator retained", m.retained}};
  for (const auto& [name, b] : rows) std::printf("  %-20s %10.1f\n", name, mib(b));
  std::printf("  %-20s %10.1f\n", "total", mib(m.total()));
  std::printf("  %-20s %10.1f (the least train.memory_budget this layout fits: set, it peaks at %.1f, within %.0f%% of "
              "it)\n",
              "fits a budget of", mib(plan::leastBudgetFitting(budgeted)), mib(budgeted), 100 * (1 - plan::kFitMargin));
  if (m.offloaded > 0) std::printf("  %-20s %10.1f (train.offload_dir, not in the total)\n", "offloaded to disk", mib(m.offloaded));
}

void printHeader(const config::Config& cfg, int world) {
  const auto& m = cfg.model;
  std::printf("plan: %.2fM params (%lld layers, hidden %lld, %lld heads, vocab %lld), micro batch %lld, "
              "world %d, sp %d, zero stage %d%s\n",
              m.numParams() / 1e6, (long long)m.layers, (long long)m.hidden, (long long)m.heads,
              (long long)m.vocabSize, (long long)cfg.microBatch, world, cfg.sequenceParallelSize, cfg.zero.stage,
              cfg.zero.offloadOptimizer.superOffload ? " + super_offload" : "");
  std::printf("      attention %s (tile %lld), loss_chunk %lld, tiled_mlp %s%s\n", config::optionName(m.attention),
              (long long)m.attentionChunk, (long long)m.lossChunk, m.tiledMlp ? "true" : "false",
              m.resolved.bf16Gemms ? ", bf16 GEMMs (assumed faster on the run's CPU; it measures)" : "");
}

void printPeak(const config::Config& cfg, int world, int localRanks) {
  const int64_t acBudget = plan::memoryBudgetFor(cfg, localRanks);
  const int k = plan::graphBlocksFor(cfg, world, acBudget);
  std::printf("seq_len %lld\n", (long long)cfg.data.seqLen);
  std::printf("activation_checkpointing \"%s\": %d of %lld blocks keep their graph, %lld recomputed "
              "(budget %.0f MiB/rank%s)\n",
              config::optionName(cfg.activationCheckpointing), k, (long long)cfg.model.layers, (long long)(cfg.model.layers - k),
              mib(acBudget), cfg.train.memoryBudget > 0 ? ", train.memory_budget" : ": 90% of this host's available memory / ranks");
  config::Config budgeted = cfg;  // what the run peaks at under the budget printed as it fits
  if (budgeted.train.memoryBudget == 0) budgeted.train.memoryBudget = acBudget;
  printBreakdown(plan::predictPeak(cfg, world, k), plan::predictPeak(budgeted, world, k).total());
}

// The longest seq_len of `c` on `w` ranks within `budget` less the margin, and its predicted peak
// in MiB ("-": none).
int64_t longestSeq(const config::Config& c, int w, int64_t budget, std::string* peak) {
  const int64_t s = plan::maxSeqLen(c, w, budget);
  *peak = "-";
  if (s > 0) {
    config::Config at = c;
    at.data.seqLen = s;
    at.train.memoryBudget = budget;  // as the run at that length is told to run
    *peak = std::to_string(static_cast<int64_t>(mib(plan::predictPeak(at, w).total())));
  }
  return s;
}

void printMaxSeq(const config::Config& cfg, int world, int64_t budget) {
  std::printf("budget %.1f MiB per rank (lengths are chosen within %.0f%% of it: the model's accuracy target)\n",
              mib(budget), 100 * (1 - plan::kFitMargin));
  std::string peak;
  const int64_t s = longestSeq(cfg, world, budget, &peak);
  // The plan's recompute choice is made against the budget: the run must be given the same one.
  const std::string budgetSet = budget % 1048576 == 0 ? fmt::format("train.memory_budget={}MiB", budget / 1048576)
                                                       : fmt::format("train.memory_budget={}", budget);
  if (s > 0)
    std::printf("this config: longest seq_len %lld (predicted peak %s MiB); run it with --set data.seq_len=%lld "
                "--set %s%s\n",
                (long long)s, peak.c_str(), (long long)s, budgetSet.c_str(),
                cfg.activationCheckpointing == config::Recompute::Auto
                    ? " (activation_checkpointing \"auto\" recomputes against that budget; without it the run "
                      "budgets 90% of the host's memory, keeps more graphs and peaks higher)"
                    : "");
  else std::printf("this config: nothing fits (the shortest seq_len %lld does not)\n", (long long)plan::minSeqLen(cfg));
  std::printf("ablation ladder (each row also needs --set %s):\n  %-28s %5s %9s %9s  %s\n", budgetSet.c_str(), "rung",
              "ranks", "seq_len", "peak_MiB", "options (--nproc ranks --set ...)");
  for (const auto& r : plan::ablationLadder(cfg)) {
    std::string opts;
    for (const auto& o : r.sets) opts += (opts.empty() ? "" : " ") + o;
    if (!r.skipped.empty()) {
      std::printf("  %-28s %5d %9s %9s  skipped: %s\n", r.name.c_str(), r.world, "-", "-", r.skipped.c_str());
      continue;
    }
    const int64_t rs = longestSeq(r.cfg, r.world, budget, &peak);
    std::printf("  %-28s %5d %9lld %9s  %s\n", r.name.c_str(), r.world, (long long)rs, peak.c_str(), opts.c_str());
  }
}

// The config `sets` give over the user's, as plan predicts it (bf16 GEMMs assumed faster).
config::Config plannedConfig(const std::string& path, const std::vector<std::string>& sets, int world) {
  nlohmann::json j = config::loadConfigJson(path, sets);
  config::RunPlan assumed;  // the run measures whether bf16 is faster; plan assumes it is
  const config::Config parsed = config::parseConfig(j, world);
  assumed.kernels.bf16Gemms = parsed.precision.bf16;
  // bf16.attention as the run decides it (the same rule and measurement).
  assumed.kernels.bf16Attention = train::bf16AttentionAskedFor(parsed, assumed.kernels.bf16Gemms) &&
                                  train::bf16AttentionWinsHere(parsed);
  return assumed.applied(parsed);
}

kernels::GemmRoute routeOf(const config::Config& cfg) {
  if (cfg.model.resolved.bf16Gemms) return kernels::GemmRoute::Bf16;
  return model::oneDnnRunsFp32Gemms(cfg.model.gemm) ? kernels::GemmRoute::OneDnn : kernels::GemmRoute::Blas;
}

// Rates at the rank's thread count (restored after); across nodes, the link at `linkSecondsPerByte`.
plan::Rates ratesFor(const config::Config& cfg, const plan::Placement& at, double linkSecondsPerByte) {
  plan::Rates r = train::measuredRates(routeOf(cfg), cfg.model.resolved.bf16Attention,
                                       train::rankThreads(at.ranksPerNode, cfg.train.threads), at.ranksPerNode > 1,
                                       cfg.train.offloadDir);
  if (at.world > at.ranksPerNode) r.linkSecondsPerByte = linkSecondsPerByte;
  return r;
}

std::string timeLine(const plan::StepTime& t, double tokens) {
  return fmt::format("{:.3f} s a step, {:.0f} tokens/s (gemm {:.3f}, attention {:.3f}, pointwise {:.3f}, overhead {:.3f}, "
                     "optimizer {:.3f}, comm {:.3f}, disk {:.3f}, decommit {:.3f}){}",
                     t.total(), tokens / t.total(), t.gemm, t.attention, t.pointwise, t.overhead, t.optimizer, t.comm,
                     t.disk, t.decommit, t.modelled.empty() ? "" : "; " + t.modelled);
}

}  // namespace

std::vector<std::string> fitSets(const std::string& path, const std::vector<std::string>& userSets,
                                 const plan::Placement& at, double linkSecondsPerByte, int64_t budget, const char* how) {
  const int world = at.world;
  const config::Config base = plannedConfig(path, userSets, world);
  train::calibrateProcessBaseline(world, at.ranksPerNode, base.train.threads);
  const plan::Rates rates = ratesFor(base, at, linkSecondsPerByte);
  auto with = [&](const std::vector<std::string>& sets) {
    std::vector<std::string> all = userSets;
    all.insert(all.end(), sets.begin(), sets.end());
    return plannedConfig(path, all, world);
  };
  const plan::FitResult r = plan::fit(base, with, at, budget, rates);
  if (world > at.ranksPerNode)
    std::printf("fit: %d nodes x %d ranks, the link between nodes at %.3g Gbit/s\n", world / at.ranksPerNode,
                at.ranksPerNode, 8e-9 / linkSecondsPerByte);
  std::printf("fit: %d candidates on %d rank%s: %zu fit %.0f MiB a rank (less %.0f%%), %d over it, %d refused by the "
              "config's rules\n",
              r.considered, world, world > 1 ? "s" : "", r.fitting.size(), mib(budget), 100 * plan::kFitMargin, r.tooBig,
              r.invalid);
  LT_CHECK(!r.fitting.empty(), "nothing fits ", mib(budget), " MiB a rank: the smallest candidate needs more. Give a larger "
           "budget, more ranks (--nproc), a shorter data.seq_len, or set train.offload_dir to offload activations to disk");
  const double tokens = plan::tokensPerStep(r.fitting.front().cfg);
  const auto& best = r.fitting.front();
  std::printf("chosen: %s\n  peak %.0f MiB a rank predicted (at %s)\n  step %s\n", best.describe().c_str(),
              mib(best.peak.total()), best.peak.phase.c_str(), timeLine(best.time, tokens).c_str());
  std::string flags = world > at.ranksPerNode ? fmt::format(" --nnodes {} --nproc-per-node {}", world / at.ranksPerNode, at.ranksPerNode)
                      : world > 1 ? fmt::format(" --nproc {}", world) : "";
  for (const auto& s : best.sets) flags += " --set '" + s + "'";
  std::printf("  %s%s\n", how, flags.c_str());
  const size_t shown = std::min<size_t>(r.fitting.size(), 6);
  if (shown > 1) std::printf("runners-up:\n  %8s %10s %9s  %s\n", "step_s", "tokens/s", "peak_MiB", "choice");
  for (size_t i = 1; i < shown; ++i) {
    const auto& c = r.fitting[i];
    std::printf("  %8.3f %10.0f %9.0f  %s\n", c.time.total(), tokens / c.time.total(), mib(c.peak.total()),
                c.describe().c_str());
  }
  for (const auto& why : r.notConsidered) std::printf("not considered: %s\n", why.c_str());
  return best.sets;
}

namespace {

// "auto" tiling as the run resolves it against `budget` (plan: the most tiling for --max-seq,
// whose lengths need it).
config::Config withTiling(config::Config cfg, int world, int64_t budget) {
  if (!cfg.model.lossChunkAuto && !cfg.model.tiledMlpAuto) return cfg;
  const plan::Tiling t = budget > 0 ? plan::chooseTiling(cfg, world, budget) : plan::Tiling{256, true};
  if (cfg.model.lossChunkAuto) cfg.model.lossChunk = t.lossChunk;
  if (cfg.model.tiledMlpAuto) cfg.model.tiledMlp = t.tiledMlp;
  return cfg;
}

// The link between nodes: --link-bandwidth, which plan (one machine) cannot measure.
double linkSecondsPerByte(const ConfigFlags& f) {
  LT_CHECK(f.nnodes > 1 || f.linkBandwidth.empty(), "--link-bandwidth prices the link between nodes; with one node "
           "it does nothing: drop it, or add --nnodes N");
  if (f.nnodes == 1) return 0;
  LT_CHECK(!f.linkBandwidth.empty(), "plan --nnodes ", f.nnodes, " needs --link-bandwidth, the rate of the link "
           "between nodes (e.g. 10Gbit/s or 1.25GB/s): plan runs on this machine alone and cannot measure it "
           "(train --fit measures it)");
  return 1 / parseLinkRate(f.linkBandwidth, "--link-bandwidth");
}

int runPlan(const ConfigFlags& f) {
  LT_CHECK(f.maxSeq.empty() || f.fit.empty(), "plan takes --max-seq or --fit, not both");
  nlohmann::json j = config::loadConfigJson(f.config, f.sets);
  const int perNode = nprocOf(j, f.nproc), world = perNode * f.nnodes;
  const plan::Placement at{world, perNode};
  const double link = f.maxSeq.empty() ? linkSecondsPerByte(f) : 0;  // --max-seq prices no time
  if (!f.fit.empty()) {
    (void)fitSets(f.config, f.sets, at, link, parseByteSize(f.fit, "--fit"),
                  f.nnodes > 1 ? "run it on each node (with its --node-rank, and node 0's --master-addr and --master-port): "
                                 "longtrain train CONFIG"
                               : "run it: longtrain train CONFIG");
    return 0;
  }
  config::Config cfg = plannedConfig(f.config, f.sets, world);
  for (const auto& line : cfg.notices) std::printf("longtrain: %s\n", line.c_str());
  const int64_t budget = f.maxSeq.empty() ? 0 : plan::parseBytes(f.maxSeq);
  train::calibrateProcessBaseline(world, perNode, cfg.train.threads);  // measured: train/process_baseline.h
  cfg = withTiling(cfg, world, f.maxSeq.empty() ? plan::memoryBudgetFor(cfg, perNode) : 0);
  printHeader(cfg, world);
  if (!f.maxSeq.empty()) {
    printMaxSeq(cfg, world, budget);
    return 0;
  }
  printPeak(cfg, world, perNode);
  const int k = plan::graphBlocksFor(cfg, world, plan::memoryBudgetFor(cfg, perNode));
  std::printf("step %s\n", timeLine(plan::predictStepTime(cfg, at, k, ratesFor(cfg, at, link)), plan::tokensPerStep(cfg)).c_str());
  return 0;
}

int runConfig(const ConfigFlags& f) {
  nlohmann::json j = config::loadConfigJson(f.config, f.sets);
  const config::Config cfg = config::parseConfig(j, nprocOf(j, f.nproc));
  // --print keeps standard output JSON: the notices go to standard error.
  for (const auto& line : cfg.notices) std::fprintf(f.print ? stderr : stdout, "longtrain: %s\n", line.c_str());
  if (f.print) std::printf("%s\n", cfg.effective.c_str());
  else std::printf("config: %s is valid (--print shows it with every default)\n", f.config.c_str());
  return 0;
}

// CONFIG, --nproc and --set, as plan and config share them (plan: --nproc also per node).
void addConfigOptions(CLI::App* c, ConfigFlags& f, bool perNode) {
  c->add_option("CONFIG", f.config, "path of the JSON config")->required();
  c->add_option(perNode ? "--nproc,--nproc-per-node" : "--nproc", f.nproc,
                perNode ? "ranks the config would run on, on each node (default: the config's train.nproc)"
                        : "ranks the config would run on (default: the config's train.nproc)")
      ->check(CLI::Range(1, 1024));
  c->add_option("--set", f.sets, "override a config key by its dotted path with a JSON value (repeatable)");
}

}  // namespace

int nprocOf(const nlohmann::json& j, int nprocFlag) {
  if (nprocFlag > 0) return nprocFlag;
  if (j.contains("train") && j["train"].is_object() && j["train"].contains("nproc") &&
      j["train"]["nproc"].is_number_integer())
    return std::max(1, j["train"]["nproc"].get<int>());
  return 1;
}

Command planCommand(CLI::App& app) {
  auto f = std::make_shared<ConfigFlags>();
  auto* plan = app.add_subcommand("plan", "predict each rank's peak memory for a config, or (--max-seq) the "
                                          "longest seq_len within a per-rank budget; runs nothing");
  addConfigOptions(plan, *f, true);
  plan->add_option("--fit", f->fit, "per-rank byte budget: the layout, ZeRO stage, tiling, micro-batch split and "
                                     "recompute set that fit it and are predicted fastest, with runners-up");
  plan->add_option("--nnodes", f->nnodes, "nodes the job would run on, --nproc ranks each (ranks fill a node "
                                         "before the next, as train's launcher places them)")
      ->check(CLI::Range(1, 4096));
  plan->add_option("--link-bandwidth", f->linkBandwidth, "with --nnodes: the link between nodes, one direction "
                                                          "(10Gbit/s, 1gbit, 1.25GB/s)");
  plan->add_option("--max-seq", f->maxSeq, "per-rank byte budget (4GiB, 512MiB, 1.5GB or plain bytes): print the "
                                           "longest seq_len that fits, and the ablation ladder's");
  return {plan, [f] { return runPlan(*f); }};
}

Command configCommand(CLI::App& app) {
  auto f = std::make_shared<ConfigFlags>();
  auto* c = app.add_subcommand("config", "check a config (every rule `train` applies) and, with --print, print it "
                                         "with every default filled in, as JSON");
  addConfigOptions(c, *f, false);
  c->add_flag("--print", f->print, "print the effective config: every key, given or default, as train would use it");
  return {c, [f] { return runConfig(*f); }};
}

}  // namespace lt::cli
