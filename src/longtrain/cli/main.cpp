// The `longtrain` command. `train` validates the config once, then either launches N local
// ranks (--nproc) or, inside a rank (torchrun-style environment), rendezvouses and trains.
// `plan` predicts each rank's peak memory (plan/memory_model.h) and runs nothing.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/comm/comm.h"
#include "longtrain/comm/launch.h"
#include "longtrain/core/check.h"
#include "longtrain/core/cpu.h"
#include "longtrain/core/memory.h"
#include "longtrain/model/kernel_isa.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/train/config.h"
#include "longtrain/train/machine.h"
#include "longtrain/train/trainer.h"

namespace {

int envInt(const char* k, int def) {
  const char* v = std::getenv(k);
  return v && *v ? std::atoi(v) : def;
}

// --nproc wins; else the config's train.nproc (validated later by parseConfig).
int nprocOf(const nlohmann::json& j, int nprocFlag) {
  if (nprocFlag > 0) return nprocFlag;
  if (j.contains("train") && j["train"].is_object() && j["train"].contains("nproc") &&
      j["train"]["nproc"].is_number_integer())
    return std::max(1, j["train"]["nproc"].get<int>());
  return 1;
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

void printBreakdown(const lt::plan::MemoryBreakdown& m) {
  std::printf("per-rank peak (MiB), at %s:\n", m.phase.c_str());
  const std::pair<const char*, int64_t> rows[] = {
      {"baseline (process)", m.baseline}, {"parameters", m.parameters}, {"gradients", m.gradients},
      {"optimizer states", m.optimizer},  {"kept activations", m.activations}, {"transient", m.transient},
      {"allocator retained", m.retained}};
  for (const auto& [name, b] : rows) std::printf("  %-20s %10.1f\n", name, mib(b));
  std::printf("  %-20s %10.1f\n", "total", mib(m.total()));
}

int cmdPlan(const std::string& configPath, int nprocFlag, const std::vector<std::string>& sets,
            const std::string& maxSeq) {
  nlohmann::json j = lt::train::loadConfigJson(configPath, sets);
  const int world = nprocOf(j, nprocFlag);
  lt::train::Config cfg = lt::train::parseConfig(j, world);
  const int64_t budget = maxSeq.empty() ? 0 : lt::plan::parseBytes(maxSeq);
  const auto& m = cfg.model;
  std::printf("plan: %.2fM params (%lld layers, hidden %lld, %lld heads, vocab %lld), micro batch %lld, "
              "world %d, sp %d, zero stage %d%s\n",
              m.numParams() / 1e6, (long long)m.layers, (long long)m.hidden, (long long)m.heads,
              (long long)m.vocabSize, (long long)cfg.microBatch, world, cfg.sequenceParallelSize, cfg.zero.stage,
              cfg.zero.offloadOptimizer.superOffload ? " + super_offload" : "");
  std::printf("      attention %s (tile %lld), loss_chunk %lld, tiled_mlp %s\n", m.attention.c_str(), (long long)m.attentionChunk,
              (long long)m.lossChunk, m.tiledMlp ? "true" : "false");
  if (maxSeq.empty()) {
    const int64_t acBudget = lt::plan::memoryBudgetFor(cfg, world);
    const int k = lt::plan::graphBlocksFor(cfg, world, acBudget);
    std::printf("seq_len %lld\n", (long long)cfg.data.seqLen);
    std::printf("activation_checkpointing \"%s\": %d of %lld blocks keep their graph, %lld recomputed "
                "(budget %.0f MiB/rank%s)\n",
                cfg.activationCheckpointing.c_str(), k, (long long)m.layers, (long long)(m.layers - k), mib(acBudget),
                cfg.train.memoryBudget > 0 ? ", train.memory_budget" : ": 90% of this host's available memory / ranks");
    printBreakdown(lt::plan::predictPeak(cfg, world, k));
    return 0;
  }
  auto longest = [&](const lt::train::Config& c, int w, std::string* peak) {
    const int64_t s = lt::plan::maxSeqLen(c, w, budget);
    if (s > 0) {
      lt::train::Config at = c;
      at.data.seqLen = s;
      *peak = std::to_string(static_cast<int64_t>(mib(lt::plan::predictPeak(at, w).total())));
    } else {
      *peak = "-";
    }
    return s;
  };
  std::printf("budget %.1f MiB per rank\n", mib(budget));
  std::string peak;
  const int64_t s = longest(cfg, world, &peak);
  if (s > 0) std::printf("this config: longest seq_len %lld (predicted peak %s MiB)\n", (long long)s, peak.c_str());
  else std::printf("this config: nothing fits (the shortest seq_len %lld does not)\n",
                   (long long)lt::plan::minSeqLen(cfg));
  std::printf("ablation ladder:\n  %-28s %5s %9s %9s  %s\n", "rung", "ranks", "seq_len", "peak_MiB",
              "options (--nproc ranks --set ...)");
  for (const auto& r : lt::plan::ablationLadder(cfg)) {
    std::string opts;
    for (const auto& o : r.sets) opts += (opts.empty() ? "" : " ") + o;
    if (!r.skipped.empty()) {
      std::printf("  %-28s %5d %9s %9s  skipped: %s\n", r.name.c_str(), r.world, "-", "-", r.skipped.c_str());
      continue;
    }
    const int64_t rs = longest(r.cfg, r.world, &peak);
    std::printf("  %-28s %5d %9lld %9s  %s\n", r.name.c_str(), r.world, (long long)rs, peak.c_str(), opts.c_str());
  }
  return 0;
}

struct TrainFlags {
  std::string config, metrics, resume, trace;
  bool resumeGiven = false, printProgram = false;
  int nproc = 0;  // 0: the config's train.nproc
  int maxRestarts = 0;
  std::vector<std::string> sets;
};

int cmdTrain(int argc, char** argv, const TrainFlags& fl) {
  const std::string& configPath = fl.config;
  const int nprocFlag = fl.nproc;
  const auto& sets = fl.sets;
  const bool inRank = std::getenv("WORLD_SIZE") != nullptr;
  nlohmann::json j = lt::train::loadConfigJson(configPath, sets);
  const int nproc = nprocOf(j, nprocFlag);
  const int world = inRank ? envInt("WORLD_SIZE", 1) : nproc;
  // Validate before launching, so a config error is reported once, not once per rank.
  lt::train::Config cfg = lt::train::parseConfig(j, world);
  std::string resume = fl.resume;
  if (fl.resumeGiven && resume.empty()) {
    resume = cfg.train.checkpoint.dir;
    LT_CHECK(!resume.empty(), "--resume without a directory needs train.checkpoint.dir in the config");
  }
  if (!resume.empty() && !inRank) (void)lt::ckpt::resolve(resume);  // fail before launching anything
  LT_CHECK(fl.maxRestarts == 0 || !cfg.train.checkpoint.dir.empty(), "--max-restarts ", fl.maxRestarts,
           " needs train.checkpoint.dir (and every_steps), or a restart would start over from step 0");
  if (!inRank && (nproc > 1 || fl.maxRestarts > 0)) {
    std::vector<std::string> args(argv, argv + argc);
    lt::comm::LaunchOptions lo;
    lo.nproc = nproc;
    lo.grace = std::chrono::milliseconds(static_cast<int64_t>(cfg.train.commTimeoutS * 1000) + 10000);
    lo.maxRestarts = fl.maxRestarts;
    return lt::comm::launchLocal(args, lo);
  }
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.train.commTimeoutS * 1000));
  auto rv = lt::comm::rendezvousFromEnv(timeout);
  int threads = cfg.train.threads;
  if (threads <= 0)
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, rv.localSize));
  at::set_num_threads(threads);
  at::set_num_interop_threads(1);

  lt::comm::Options co;
  co.timeout = timeout;
  lt::comm::Groups groups;
  if (rv.size == 1) {
    groups = lt::comm::makeGroups(c10::make_intrusive<c10d::HashStore>(), 0, 1, cfg.sequenceParallelSize, co);
  } else {
    groups = lt::comm::makeGroups(rv.store, rv.rank, rv.size, cfg.sequenceParallelSize, co, rv.heartbeatStore);
  }
  if (cfg.train.memoryBudget == 0) cfg.train.memoryBudget = lt::plan::memoryBudgetFor(cfg, rv.localSize);
  lt::train::TrainOptions to;
  to.metricsPath = fl.metrics;
  to.tracePath = fl.trace;
  to.printProgram = fl.printProgram;
  to.resume = resume;
  // Fault injection (tests) fires on the first attempt only, so a restarted job can finish.
  const int attempt = envInt("LONGTRAIN_RESTART_ATTEMPT", 0);
  to.restarted = attempt > 0;
  if (const char* id = std::getenv("LONGTRAIN_RUN_ID")) to.runId = id;
  if (attempt == 0) {
    to.faultKillRank = envInt("LONGTRAIN_FAULT_KILL_RANK", -1);
    to.faultKillStep = envInt("LONGTRAIN_FAULT_KILL_STEP", -1);
    if (const char* stage = std::getenv("LONGTRAIN_FAULT_CKPT_STAGE"); stage && *stage) {
      // This rank dies at that stage of its n-th save (LONGTRAIN_FAULT_CKPT_SAVE, default 1).
      const bool me = envInt("LONGTRAIN_FAULT_KILL_RANK", 0) == rv.rank;
      const int nth = envInt("LONGTRAIN_FAULT_CKPT_SAVE", 1);
      to.checkpointHook = [st = std::string(stage), me, nth, saves = 0](const std::string& s) mutable {
        if (s == "rank_file_fsynced") ++saves;  // the first stage of every save, on every rank
        if (me && s == st && saves == nth) ::raise(SIGKILL);
      };
    }
  }
  auto s = lt::train::runTraining(cfg, groups, to);
  if (rv.rank == 0)
    std::printf("done: %lld steps, final loss %.4f, eval loss %.4f, eval accuracy %.3f, %.0f tokens/s\n",
                (long long)s.steps, s.finalLoss, s.evalLoss, s.evalAccuracy, s.tokensPerS);
  groups.world->barrier();  // nobody tears down its process group while a peer still needs it
  return 0;
}

// `longtrain info`: what a run would get on this machine, and whether its GEMM computes right.
int cmdInfo(int threads) {
  at::set_num_threads(threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  const auto isa = lt::cpuIsa();
  const auto blas = lt::blasKernelReport();
  std::printf("cpu: %s%s\n", isa.name().c_str(), isa.amd ? " (AMD)" : "");
  std::printf("blas: core=%s  %s\n", blas.core.empty() ? "unknown" : blas.core.c_str(), blas.describe().c_str());
  if (const std::string c = lt::blasConfig(); !c.empty()) std::printf("blas config: %s\n", c.c_str());
  std::printf("allocator: %s\n", lt::allocatorName().c_str());
  std::printf("threads: %d\n", at::get_num_threads());
  std::printf("gemm peak: %.1f GFLOP/s (fp32, 1024^3, best of several)\n", lt::train::measureGemmPeakFlops() / 1e9);
  std::printf("gemm peak bf16: %.1f GFLOP/s (libtorch's oneDNN; bf16.enabled uses it only where it is faster)\n",
              lt::train::measureGemmPeakFlops(true) / 1e9);
  std::printf("fused kernels: %s (attention, RMSNorm, SwiGLU)\n", lt::model::kernelIsaName(lt::model::kernelBestIsa()));
  const double err = lt::train::blasRelativeError();
  std::printf("gemm relative error: %.3g (against a double-precision loop; fp32 expects < 1e-5)\n", err);
  LT_CHECK(err < 1e-5, "the BLAS kernel ", blas.core, " computes wrong results here (relative error ", err,
           "); set OPENBLAS_CORETYPE to an older kernel (e.g. Haswell or Prescott)");
  return 0;
}

int cmdExport(const std::string& path, const std::string& out) {
  lt::ckpt::Checkpoint c(lt::ckpt::resolve(path));
  lt::ckpt::exportModel(c, out);
  int64_t n = 0;
  for (const auto& p : c.manifest().params) n += p.numel();
  std::printf("export: %s (step %lld) -> %s: %zu tensors, %.2fM parameters, fp32, Hugging Face Llama names\n",
              c.dir().c_str(), (long long)c.manifest().step, out.c_str(), c.manifest().params.size(), n / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  lt::ensureBestBlasKernel(argv);  // may re-execute this program once, before anything runs
  CLI::App app{"longtrain: long-sequence transformer training (Ulysses SP, ZeRO-3/SuperOffload, compile passes)"};
  app.require_subcommand(1);
  auto* train = app.add_subcommand("train", "train a model from a JSON config (DeepSpeed key names)");
  TrainFlags fl;
  train->add_option("CONFIG", fl.config, "path of the JSON config")->required();
  train->add_option("--nproc", fl.nproc, "local ranks to launch (like torchrun --standalone --nproc-per-node); "
                                     "default: the config's train.nproc")
      ->check(CLI::Range(1, 1024));
  train->add_option("--set", fl.sets, "override a config key by its dotted path with a JSON value, e.g. "
                                   "--set zero_optimization.stage=3 (repeatable)");
  train->add_option("--metrics", fl.metrics, "write one JSON object per optimizer step to this file (rank 0; "
                                             "appended to when resuming)");
  train->add_flag("--print-program", fl.printProgram, "print the step program before training");
  train->add_option("--trace", fl.trace, "write a Chrome trace-event JSON of every rank (program instructions, "
                                         "collectives, SuperOffload Adam steps, checkpoint writes; open in Perfetto)");
  auto* resumeOpt = train->add_option("--resume", fl.resume, "resume from a checkpoint: a step directory, or a root "
                                                             "(its newest complete checkpoint); default: "
                                                             "train.checkpoint.dir")
                        ->expected(0, 1);
  train->add_option("--max-restarts", fl.maxRestarts, "restart the whole job from its newest checkpoint up to N "
                                                      "times when a rank fails (torchrun's --max-restarts)")
      ->check(CLI::Range(0, 1000));
  auto* exp = app.add_subcommand("export", "write a checkpoint's model as one safetensors file with Hugging Face "
                                           "Llama tensor names");
  std::string ckptPath, outPath;
  exp->add_option("CKPT", ckptPath, "a checkpoint directory, or a root (its newest complete checkpoint)")->required();
  exp->add_option("--out", outPath, "the safetensors file to write")->required();
  auto* plan = app.add_subcommand("plan", "predict each rank's peak memory for a config, or (--max-seq) the "
                                          "longest seq_len within a per-rank budget; runs nothing");
  std::string planConfig, maxSeq;
  int planNproc = 0;
  std::vector<std::string> planSets;
  plan->add_option("CONFIG", planConfig, "path of the JSON config")->required();
  plan->add_option("--nproc", planNproc, "ranks the config would run on (default: the config's train.nproc)")
      ->check(CLI::Range(1, 1024));
  plan->add_option("--set", planSets, "override a config key by its dotted path with a JSON value (repeatable)");
  plan->add_option("--max-seq", maxSeq, "per-rank byte budget (4GiB, 512MiB, 1.5GB or plain bytes): print the "
                                        "longest seq_len that fits, and the ablation ladder's");
  auto* info = app.add_subcommand("info", "print the CPU, the BLAS kernel and allocator a run gets, the measured "
                                          "GEMM peak, and check the kernel's numerics");
  int infoThreads = 0;
  info->add_option("--threads", infoThreads, "intra-op threads (default: every core, as one rank trains)")->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  // Flush subnormals to zero before any thread pool exists (new threads inherit the mode):
  // training drives some values (softmax tails, Adam's v) subnormal, and x86 then runs
  // those ops ~100x slower. Measured here: tokens/s fell from 10k to 3.7k within 100 steps.
  at::globalContext().setFlushDenormal(true);
  const int rank = envInt("RANK", 0);
  try {
    if (*train) {
      fl.resumeGiven = resumeOpt->count() > 0;
      return cmdTrain(argc, argv, fl);
    }
    if (*exp) return cmdExport(ckptPath, outPath);
    if (*info) return cmdInfo(infoThreads);
    if (*plan) return cmdPlan(planConfig, planNproc, planSets, maxSeq);
  } catch (const std::exception& e) {
    if (std::getenv("WORLD_SIZE")) std::fprintf(stderr, "longtrain: error on rank %d: %s\n", rank, e.what());
    else std::fprintf(stderr, "longtrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
