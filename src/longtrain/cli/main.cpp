// The `longtrain` command. `train` validates the config once, then either launches N local
// ranks (--nproc) or, inside a rank (torchrun-style environment), rendezvouses and trains.
// `plan` predicts each rank's peak memory (plan/memory_model.h) and runs nothing.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/cli/eval_command.h"
#include "longtrain/comm/binding.h"
#include "longtrain/comm/comm.h"
#include "longtrain/comm/identity.h"
#include "longtrain/comm/launch.h"
#include "longtrain/config/parse.h"
#include "longtrain/config/token_sidecar.h"
#include "longtrain/core/check.h"
#include "longtrain/core/cpu.h"
#include "longtrain/core/memory.h"
#include "longtrain/core/phase.h"
#include "longtrain/core/stop.h"
#include "longtrain/core/strings.h"
#include "longtrain/data/tokenizer.h"
#include "longtrain/kernels/isa.h"
#include "longtrain/model/generate.h"
#include "longtrain/offload/activation_file.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/report/plot.h"
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
  if (m.offloaded > 0) std::printf("  %-20s %10.1f (train.offload_dir, not in the total)\n", "offloaded to disk", mib(m.offloaded));
}

// `longtrain config CONFIG`: the config checked as train checks it; with --print, the effective
// config, every default filled in, as JSON.
int cmdConfig(const std::string& configPath, int nprocFlag, const std::vector<std::string>& sets, bool print) {
  nlohmann::json j = lt::config::loadConfigJson(configPath, sets);
  const lt::config::Config cfg = lt::config::parseConfig(j, nprocOf(j, nprocFlag));
  if (print) std::printf("%s\n", cfg.effective.c_str());
  else std::printf("config: %s is valid (--print shows it with every default)\n", configPath.c_str());
  return 0;
}

int cmdPlan(const std::string& configPath, int nprocFlag, const std::vector<std::string>& sets,
            const std::string& maxSeq) {
  nlohmann::json j = lt::config::loadConfigJson(configPath, sets);
  const int world = nprocOf(j, nprocFlag);
  lt::config::Config cfg = lt::config::parseConfig(j, world);
  // bf16.enabled: the run measures at start-up whether bf16 is faster and trains in fp32 if not;
  // plan assumes bf16 (and says so), so on a CPU where it is slower the peak is higher than this.
  cfg.model.bf16Compute = cfg.bf16;
  const int64_t budget = maxSeq.empty() ? 0 : lt::plan::parseBytes(maxSeq);
  const auto& m = cfg.model;
  std::printf("plan: %.2fM params (%lld layers, hidden %lld, %lld heads, vocab %lld), micro batch %lld, "
              "world %d, sp %d, zero stage %d%s\n",
              m.numParams() / 1e6, (long long)m.layers, (long long)m.hidden, (long long)m.heads,
              (long long)m.vocabSize, (long long)cfg.microBatch, world, cfg.sequenceParallelSize, cfg.zero.stage,
              cfg.zero.offloadOptimizer.superOffload ? " + super_offload" : "");
  std::printf("      attention %s (tile %lld), loss_chunk %lld, tiled_mlp %s%s\n", m.attention.c_str(), (long long)m.attentionChunk,
              (long long)m.lossChunk, m.tiledMlp ? "true" : "false",
              m.bf16Compute ? ", bf16 GEMMs (assumed faster on the run's CPU; it measures)" : "");
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
  auto longest = [&](const lt::config::Config& c, int w, std::string* peak) {
    const int64_t s = lt::plan::maxSeqLen(c, w, budget);
    if (s > 0) {
      lt::config::Config at = c;
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

// Before the first allocation: the memory model's smallest peak for this config (every block
// recomputed, unless activation_checkpointing is "none") against what a rank may use. The
// 1.2x margin covers the model's error (within 12% on bench/plan_accuracy.sh), so only a
// config that cannot fit is refused, with the figures instead of std::bad_alloc or the OOM killer.
void preflightMemory(const lt::config::Config& cfg, int world, int localRanks) {
  const int64_t limit = lt::rankMemoryLimitBytes(localRanks);
  if (!cfg.train.memoryPreflight || limit <= 0) return;
  const int k = cfg.activationCheckpointing == "none" ? static_cast<int>(cfg.model.layers) : 0;
  const int64_t need = lt::plan::predictPeak(cfg, world, k).total();
  if (static_cast<double>(need) <= 1.2 * static_cast<double>(limit)) return;
  const int64_t longest = lt::plan::maxSeqLen(cfg, world, limit);
  LT_CHECK(false, "this config needs an estimated ", static_cast<int64_t>(mib(need)), " MiB per rank (longtrain ",
           "plan's prediction) but a rank may use ", static_cast<int64_t>(mib(limit)), " MiB (MemAvailable and the ",
           "cgroup limit, shared by ", localRanks, " local rank(s)); ",
           longest > 0 ? "the longest data.seq_len that fits is " + std::to_string(longest)
                       : std::string("nothing fits at any data.seq_len"),
           ". Lower data.seq_len or the micro batch, or spread the state over more ranks (ZeRO-3, ",
           "sequence_parallel_size); train.memory_preflight=false skips this check");
}

struct TrainFlags {
  std::string config, metrics, resume, trace;
  bool resumeGiven = false, printProgram = false;
  int nproc = 0;  // per node; 0: the config's train.nproc
  int maxRestarts = 0;
  int nnodes = 1, nodeRank = 0, masterPort = 29500;
  double rdzvTimeoutS = 300;
  std::string masterAddr, rdzvId;
  std::vector<std::string> sets;
  CLI::Option* resumeOption = nullptr;  // --resume given (with or without a directory)
};

// What every rank of the job must agree on (comm/identity.h): the effective config, the world,
// the job id and the build; and where this rank runs.
lt::comm::RankIdentity rankIdentity(const lt::config::Config& cfg, int world, const std::string& bindAddress) {
  lt::comm::RankIdentity id;
  const auto flat = nlohmann::json::parse(cfg.source).flatten();
  for (const auto& [pointer, v] : flat.items()) {  // "/optimizer/params/lr" -> "optimizer.params.lr"
    std::string key = pointer.substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    id.agreed[key] = v.dump();
  }
  id.agreed["world_size"] = std::to_string(world);
  id.agreed["binary"] = lt::comm::binaryDigest();
  for (const char* k : {"LONGTRAIN_RUN_ID", "TORCHELASTIC_RUN_ID"})
    if (const char* v = std::getenv(k); v && *v) id.agreed[std::string("job_id (") + k + ")"] = v;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  id.host = std::string(host) + (bindAddress.empty() ? "" : " " + bindAddress);
  return id;
}

// Several nodes (--nnodes, --master-addr) or several local ranks: this process launches.
int launchRanks(int argc, char** argv, const TrainFlags& fl, const lt::config::Config& cfg, int nproc) {
  std::vector<std::string> args(argv, argv + argc);
  lt::comm::LaunchOptions lo;
  lo.nprocPerNode = nproc;
  lo.nnodes = fl.nnodes;
  lo.nodeRank = fl.nodeRank;
  lo.masterAddr = fl.masterAddr;
  lo.masterPort = fl.masterPort;
  lo.rdzvId = fl.rdzvId;
  lo.rdzvTimeout = std::chrono::milliseconds(static_cast<int64_t>(fl.rdzvTimeoutS * 1000));
  lo.grace = std::chrono::milliseconds(cfg.train.commTimeoutMs() + 10000);
  lo.maxRestarts = fl.maxRestarts;
  return lt::comm::launch(args, lo);
}

// Intra-op threads (train.threads, else this rank's share of the cores) and the CPUs this
// rank owns: local rank l of a process launch owns cores [l x t, (l + 1) x t).
// Without a launcher (no LOCAL_RANK) the rank owns no particular CPUs.
std::vector<int> setUpThreads(const lt::config::Config& cfg, int localRank, int localSize, bool launched) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int threads = cfg.train.threads > 0 ? cfg.train.threads : std::max(1, cores / std::max(1, localSize));
  at::set_num_threads(threads);
  at::set_num_interop_threads(1);
  std::vector<int> cpus;
  if (launched)
    for (int c = localRank * threads; c < (localRank + 1) * threads && c < cores; ++c) cpus.push_back(c);
  return cpus;
}

// The groups of this rank: one rank alone, or Gloo over the rendezvous store after the
// ranks agreed on one job identity. Gloo binds the interface toward MASTER_ADDR.
lt::comm::Groups rankGroups(const lt::config::Config& cfg, const lt::comm::EnvRendezvous& rv) {
  lt::comm::Options co;
  co.timeout = std::chrono::milliseconds(cfg.train.commTimeoutMs());
  if (rv.size == 1)
    return lt::comm::makeGroups(c10::make_intrusive<c10d::HashStore>(), 0, 1, cfg.sequenceParallelSize, co);
  const char* master = std::getenv("MASTER_ADDR");  // --nproc children get 127.0.0.1: loopback
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  const auto b = lt::comm::glooBindingFor(master ? master : "", ifname ? ifname : "");
  co.hostname = b.hostname;
  co.interfaces = b.interfaces;
  if (rv.rank == 0 && (!b.interfaces.empty() || b.hostname != "127.0.0.1"))
    std::printf("longtrain: %s\n", b.describe().c_str());
  const auto hosts = lt::comm::exchangeIdentity(*rv.store, rv.rank, rv.size, rankIdentity(cfg, rv.size, co.hostname),
                                                co.timeout, rv.storeWhere);
  auto groups = lt::comm::makeGroups(rv.store, rv.rank, rv.size, cfg.sequenceParallelSize, co, rv.heartbeatStore,
                                     cfg.layout.R);
  groups.liveness->setHosts(hosts);
  groups.liveness->setStoreWhere(rv.storeWhere);
  return groups;
}

// Fault injection (tests) fires on the first attempt only, so a restarted job can finish.
void addFaultHooks(lt::train::TrainOptions& to, int rank) {
  to.faultKillRank = envInt("LONGTRAIN_FAULT_KILL_RANK", -1);
  to.faultKillStep = envInt("LONGTRAIN_FAULT_KILL_STEP", -1);
  const char* stage = std::getenv("LONGTRAIN_FAULT_CKPT_STAGE");
  if (!stage || !*stage) return;
  // This rank dies at that stage of its n-th save (LONGTRAIN_FAULT_CKPT_SAVE, default 1).
  const bool me = envInt("LONGTRAIN_FAULT_KILL_RANK", 0) == rank;
  const int nth = envInt("LONGTRAIN_FAULT_CKPT_SAVE", 1);
  to.checkpointHook = [st = std::string(stage), me, nth, saves = 0](const std::string& s) mutable {
    if (s == "rank_file_fsynced") ++saves;  // the first stage of every save, on every rank
    if (me && s == st && saves == nth) ::raise(SIGKILL);
  };
}

// Inside a rank: rendezvous, build the groups, train.
int runRank(lt::config::Config cfg, const TrainFlags& fl, const std::string& resume) {
  lt::installStopHandlers();
  auto rv = lt::comm::rendezvousFromEnv(std::chrono::milliseconds(cfg.train.commTimeoutMs()));
  lt::train::TrainOptions to;
  to.engine.rankCpus = setUpThreads(cfg, rv.localRank, rv.localSize, std::getenv("LOCAL_RANK") != nullptr);
  lt::comm::Groups groups = rankGroups(cfg, rv);
  if (cfg.train.memoryBudget == 0) cfg.train.memoryBudget = lt::plan::memoryBudgetFor(cfg, rv.localSize);
  to.metricsPath = fl.metrics;
  to.tracePath = fl.trace;
  to.printProgram = fl.printProgram;
  to.resume = resume;
  const int attempt = envInt("LONGTRAIN_RESTART_ATTEMPT", 0);
  to.restarted = attempt > 0;
  if (const char* id = std::getenv("LONGTRAIN_RUN_ID")) to.runId = id;
  if (attempt == 0) addFaultHooks(to, rv.rank);
  auto s = lt::train::runTraining(cfg, groups, to);
  if (rv.rank == 0 && !s.stopSignal)
    std::printf("done: %lld steps, final loss %.4f%s, %.0f tokens/s\n", (long long)s.steps, s.finalLoss,
                s.evalTokens > 0 ? fmt::format(", eval loss {:.4f}, eval accuracy {:.3f}", s.evalLoss, s.evalAccuracy).c_str() : "",
                s.tokensPerS);
  groups.world->barrier();  // nobody tears down its process group while a peer still needs it
  return s.stopSignal ? 128 + s.stopSignal : 0;
}

int cmdTrain(int argc, char** argv, const TrainFlags& fl) {
  const bool inRank = std::getenv("WORLD_SIZE") != nullptr;
  nlohmann::json j = lt::config::loadConfigJson(fl.config, fl.sets);
  const int nproc = nprocOf(j, fl.nproc);
  const int world = inRank ? envInt("WORLD_SIZE", 1) : nproc * fl.nnodes;
  // Validate before launching, so a config error is reported once, not once per rank.
  lt::config::Config cfg = lt::config::parseConfig(j, world);
  preflightMemory(cfg, world, inRank ? envInt("LOCAL_WORLD_SIZE", 1) : nproc);
  std::string resume = fl.resume;
  if (fl.resumeGiven && resume.empty()) {
    resume = cfg.train.checkpoint.dir;
    LT_CHECK(!resume.empty(), "--resume without a directory needs train.checkpoint.dir in the config");
  }
  if (!resume.empty() && !inRank) (void)lt::ckpt::resolve(resume);  // fail before launching anything
  if (!inRank && !cfg.train.checkpoint.dir.empty()) lt::ckpt::checkWritable(cfg.train.checkpoint.dir);
  if (!inRank && !cfg.train.offloadDir.empty()) (void)lt::offload::checkOffloadDir(cfg.train.offloadDir);
  LT_CHECK(fl.maxRestarts == 0 || !cfg.train.checkpoint.dir.empty(), "--max-restarts ", fl.maxRestarts,
           " needs train.checkpoint.dir (and every_steps), or a restart would start over from step 0");
  if (!inRank && (nproc > 1 || fl.maxRestarts > 0 || fl.nnodes > 1 || !fl.masterAddr.empty()))
    return launchRanks(argc, argv, fl, cfg, nproc);
  return runRank(std::move(cfg), fl, resume);
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
  std::printf("gemm peak: %.1f GFLOP/s (fp32 through the BLAS, 1024^3, best of several)\n",
              lt::train::measureGemmPeakFlops() / 1e9);
  std::printf("gemm peak onednn: %.1f GFLOP/s (fp32, oneDNN's sgemm; model.gemm \"auto\" takes it where the BLAS kernel is below the CPU)\n",
              lt::train::measureGemmPeakFlops(lt::kernels::GemmRoute::OneDnn) / 1e9);
  std::printf("gemm peak bf16: %.1f GFLOP/s (oneDNN's bf16 matmul, fp32 result; bf16.enabled uses it only where it is faster)\n",
              lt::train::measureGemmPeakFlops(lt::kernels::GemmRoute::Bf16) / 1e9);
  std::printf("fused kernels: %s (attention, RMSNorm, SwiGLU)\n", lt::kernels::isaName(lt::kernels::isaBest()));
  const double err = lt::train::gemmRelativeError();
  std::printf("gemm relative error: %.3g (against a double-precision loop; fp32 expects < 1e-5)\n", err);
  LT_CHECK(err < 1e-5, "the BLAS kernel ", blas.core, " computes wrong results here (relative error ", err,
           "); set OPENBLAS_CORETYPE to an older kernel (e.g. Haswell or Prescott)");
  const double oneDnnErr = lt::train::gemmRelativeError(lt::kernels::GemmRoute::OneDnn);
  std::printf("gemm relative error onednn: %.3g\n", oneDnnErr);
  LT_CHECK(oneDnnErr < 1e-5, "oneDNN's sgemm computes wrong results here (relative error ", oneDnnErr,
           "); set model.gemm=\"blas\"");
  return 0;
}

// The tokenizer files a run had, under their standard names: data.tokenizer's (with the
// tokenizer_config.json beside a tokenizer.json), then those beside model.init_from's weights.
std::vector<lt::ckpt::HfExportOptions::TokenizerFile> runTokenizerFiles(const nlohmann::json& cfg) {
  namespace fs = std::filesystem;
  std::vector<lt::ckpt::HfExportOptions::TokenizerFile> out;
  const auto add = [&](const fs::path& src, const std::string& name) {
    const bool taken = std::any_of(out.begin(), out.end(), [&](const auto& o) { return o.name == name; });
    if (!taken && fs::is_regular_file(src)) out.push_back({src.string(), name});
  };
  std::string given;  // data.tokenizer, else the one data.path's sidecar records
  if (cfg.contains("data") && cfg["data"].is_object()) {
    given = cfg["data"].value("tokenizer", "");
    if (const auto s = lt::config::readTokenSidecar(cfg["data"].value("path", "")); given.empty() && s)
      given = s->tokenizer;
  }
  {
    if (!given.empty() && fs::exists(given)) {
      const lt::data::Tokenizer tok(given);
      const bool json = tok.kind() == "tokenizer.json";
      add(tok.path(), json ? "tokenizer.json" : "tokenizer.model");
      if (json)
        for (const char* side : {"tokenizer_config.json", "special_tokens_map.json"})
          add(fs::path(tok.path()).parent_path() / side, side);
    }
  }
  if (cfg.contains("model") && cfg["model"].is_object() && cfg["model"].value("init_from", "") != "")
    for (const auto& f : lt::ckpt::kTokenizerFiles) add(fs::path(cfg["model"]["init_from"].get<std::string>()) / f, f);
  return out;
}

int cmdExport(const std::string& path, const std::string& out, const std::string& dtype) {
  lt::ckpt::Checkpoint c(lt::ckpt::resolve(path));
  int64_t n = 0;
  for (const auto& p : c.manifest().params) n += p.numel();
  if (out.size() > 12 && out.compare(out.size() - 12, 12, ".safetensors") == 0) {  // one file, as before
    LT_CHECK(dtype == "fp32", "export --dtype ", dtype, " is for a model directory; give --out DIR");
    lt::ckpt::exportModel(c, out);
    std::printf("export: %s (step %lld) -> %s: %zu tensors, %.2fM parameters, fp32, Hugging Face names\n",
                c.dir().c_str(), (long long)c.manifest().step, out.c_str(), c.manifest().params.size(), n / 1e6);
    return 0;
  }
  lt::ckpt::HfExportOptions o;
  o.dtype = dtype;
  o.tokenizerFiles = runTokenizerFiles(c.manifest().config);
  for (const auto& f : o.tokenizerFiles)
    if ((f.name == "tokenizer.model" || f.name == "tokenizer.json") && o.eosId < 0) {
      const lt::data::Tokenizer tok(f.source);
      o.bosId = tok.bosId();
      o.eosId = tok.eosId();
    }
  const auto r = lt::ckpt::exportHfDirectory(c, out, o);
  std::string copied;
  for (const auto& f : r.copied) copied += " " + f;
  std::printf("export: %s (step %lld) -> %s/: config.json, model.safetensors (%lld tensors, %.2fM parameters, %s, "
              "%.1f MiB)%s%s\n",
              c.dir().c_str(), (long long)c.manifest().step, out.c_str(), (long long)r.tensors, r.parameters / 1e6,
              dtype.c_str(), r.bytes / 1048576.0, copied.empty() ? "" : ", tokenizer:", copied.c_str());
  std::printf("        load it with model.init_from=%s (longtrain) or AutoModelForCausalLM.from_pretrained (Hugging Face)\n",
              out.c_str());
  return 0;
}

struct GenerateFlags {
  std::string source, prompt, promptIds, tokenizer;
  lt::model::SamplingOptions sampling;
  bool ignoreEos = false;
};

std::vector<int64_t> parseIds(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    LT_CHECK(!part.empty() && end && *end == '\0', "--prompt-ids '", text, "': '", part, "' is not a token id ",
             "(give comma-separated integers, e.g. 1,15,27)");
    ids.push_back(v);
  }
  return ids;
}

// Prints the text of the tokens so far beyond what is already on screen. SentencePiece joins
// pieces (and drops a leading space), so prompt and output are decoded whole and the new
// suffix printed.
struct TextStream {
  const lt::data::Tokenizer& tok;
  std::vector<int64_t> ids;
  std::string shown;
  TextStream(const lt::data::Tokenizer& t, std::vector<int64_t> prompt) : tok(t), ids(std::move(prompt)) {
    shown = tok.decode(ids);
    std::fputs(shown.c_str(), stdout);
  }
  void add(int64_t id) {
    ids.push_back(id);
    const std::string text = tok.decode(ids);
    if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) {
      std::fputs(text.c_str() + shown.size(), stdout);
      std::fflush(stdout);
      shown = text;
    }
  }
};

int cmdGenerate(GenerateFlags f) {
  at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  auto m = lt::ckpt::loadInferenceModel(f.source);
  const std::string tokPath = f.tokenizer.empty() ? m.tokenizer : f.tokenizer;
  std::unique_ptr<lt::data::Tokenizer> tok;
  if (!tokPath.empty()) tok = std::make_unique<lt::data::Tokenizer>(tokPath);
  LT_CHECK(f.prompt.empty() || tok, "--prompt needs a tokenizer: ", f.source, " names none; give --tokenizer ",
           "(a tokenizer.json, a tokenizer.model or a model directory), or the prompt as token ids with --prompt-ids");
  LT_CHECK(f.prompt.empty() != f.promptIds.empty(), "give the prompt as text (--prompt) or as ids (--prompt-ids)");
  std::vector<int64_t> prompt = f.promptIds.empty() ? tok->encode(f.prompt) : parseIds(f.promptIds);
  const int64_t start = !tok ? -1 : m.promptAfterEos ? tok->eosId() : tok->bosId();
  if (start >= 0 && f.promptIds.empty()) prompt.insert(prompt.begin(), start);
  if (tok && tok->vocabSize() > m.model->config().vocabSize)
    LT_CHECK(false, "the tokenizer '", tokPath, "' has ", tok->vocabSize(), " tokens, the model only ",
             m.model->config().vocabSize, ": they do not belong together");
  if (tok && !f.ignoreEos) f.sampling.stopToken = tok->eosId();
  std::string how = "greedy";
  if (f.sampling.temperature > 0)
    how = fmt::format("temperature {}{}, seed {}", f.sampling.temperature,
                      f.sampling.topK > 0 ? fmt::format(", top-k {}", f.sampling.topK) : "", f.sampling.seed);
  std::fprintf(stderr, "generate: %s, %.2fM parameters, %zu prompt tokens, %s\n", m.describe.c_str(),
               m.model->config().numParams() / 1e6, prompt.size(), how.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> out;
  if (tok) {
    TextStream ts(*tok, prompt);
    out = lt::model::generate(*m.model, prompt, f.sampling, [&](int64_t id) { ts.add(id); });
  } else {
    out = lt::model::generate(*m.model, prompt, f.sampling, [](int64_t id) {
      std::printf("%lld ", (long long)id);
      std::fflush(stdout);
    });
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n");
  std::fprintf(stderr, "generate: %zu tokens in %.2f s (%.1f tokens/s)\n", out.size(), s, out.size() / std::max(s, 1e-9));
  return 0;
}

struct TokenizeFlags {
  std::string tokenizer, out, splitOn, tokenizerType = "unigram";
  int64_t trainVocab = 0;  // 0: use --tokenizer as it is
  std::vector<std::string> inputs;
};

// --split-on as a user types it ('%\n'): \n, \t, \r and \\ are escapes.
std::string unescapeSeparator(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    LT_CHECK(i + 1 < s.size(), "--split-on '", s, "' ends in a lone backslash; escapes are \\n, \\t, \\r and \\\\");
    const char c = s[++i];
    LT_CHECK(c == 'n' || c == 't' || c == 'r' || c == '\\', "--split-on '", s, "': '\\", c,
             "' is not an escape; use \\n, \\t, \\r or \\\\");
    out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : '\\';
  }
  return out;
}

// `longtrain tokenize`: optionally trains the tokenizer on the inputs, then writes the token file.
int cmdTokenize(const TokenizeFlags& f) {
  namespace fs = std::filesystem;
  const std::string sep = unescapeSeparator(f.splitOn);
  const std::string out = f.out.empty() ? fs::path(f.inputs.front()).stem().string() + ".bin" : f.out;
  for (const auto& in : f.inputs) {
    std::error_code ec;
    LT_CHECK(!fs::equivalent(in, out, ec), "the output '", out, "' is the input '", in, "'; give another --out");
  }
  if (f.trainVocab > 0) {
    const std::string suffix = ".model";
    LT_CHECK(f.tokenizer.size() > suffix.size() &&
                 f.tokenizer.compare(f.tokenizer.size() - suffix.size(), suffix.size(), suffix) == 0,
             "--tokenizer '", f.tokenizer, "' must end in .model with --train-tokenizer (SentencePiece writes ",
             "<prefix>.model and <prefix>.vocab)");
    const std::string prefix = f.tokenizer.substr(0, f.tokenizer.size() - suffix.size());
    const auto t0 = std::chrono::steady_clock::now();
    lt::data::trainTokenizer(f.inputs, f.trainVocab, prefix, sep, f.tokenizerType);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("tokenizer: trained %s, vocabulary %lld (asked %lld), on %zu file(s) in %.2f s -> %s, %s.vocab\n",
                f.tokenizerType.c_str(), (long long)lt::data::Tokenizer(f.tokenizer).vocabSize(),
                (long long)f.trainVocab, f.inputs.size(), s, f.tokenizer.c_str(), prefix.c_str());
  }
  lt::data::TokenizeOptions o;
  o.tokenizerPath = f.tokenizer;
  o.outPath = out;
  o.inputs = f.inputs;
  o.splitOn = sep;
  const auto r = lt::data::tokenizeFiles(o);
  const char* type = r.bytesPerToken == 2 ? "uint16" : "uint32";
  std::printf("tokenize: %lld documents, %lld tokens -> %s (%.1f MB; %s, %d bytes per token, EOS after every "
              "document)\n",
              (long long)r.documents, (long long)r.tokens, out.c_str(), r.tokens * r.bytesPerToken / 1e6, type,
              r.bytesPerToken);
  std::printf("  vocabulary %lld, EOS id %lld; %.1f MB of text in %.2f s (%.1f MB/s, %.0f tokens/s)\n",
              (long long)r.vocabSize, (long long)r.eosId, r.bytesRead / 1e6, r.seconds,
              r.bytesRead / 1e6 / std::max(r.seconds, 1e-9), r.tokens / std::max(r.seconds, 1e-9));
  std::printf("  sidecar: %s.json (the tokenizer, its SHA-256, dtype and EOS: data.packing and eval read them)\n",
              out.c_str());
  std::printf("  config: \"data\": {\"type\": \"%s\", \"path\": \"%s\", \"packing\": \"documents\"} with "
              "model.vocab_size >= %lld\n",
              type, fs::absolute(out).string().c_str(), (long long)r.vocabSize);
  return 0;
}

// `longtrain plot`: the curves of one or more --metrics files, overlaid in one SVG (or PNG).
int cmdPlot(const std::vector<std::string>& files, const std::vector<std::string>& labels, const std::string& out,
            const lt::report::PlotOptions& opt) {
  const auto runs = lt::report::readRuns(files, labels);
  lt::report::writePlot(runs, out, opt);
  std::string empty;
  for (const auto& p : lt::report::emptyPanels(runs)) empty += (empty.empty() ? " (no data: " : ", ") + p;
  std::printf("plot: %zu run%s, 4 panels -> %s%s\n", runs.size(), runs.size() == 1 ? "" : "s", out.c_str(),
              empty.empty() ? "" : (empty + ")").c_str());
  return 0;
}

struct ExportFlags {
  std::string ckpt, out, dtype = "fp32";
};

struct PlanFlags {
  std::string config, maxSeq;
  int nproc = 0;
  std::vector<std::string> sets;
};

struct PlotFlags {
  std::vector<std::string> files, labels;
  std::string out;
  lt::report::PlotOptions options;
};

// ---------------------------------------------------------------------------- subcommands
CLI::App* addTrainCommand(CLI::App& app, TrainFlags& fl) {
  auto* train = app.add_subcommand("train", "train a model from a JSON config (DeepSpeed key names)");
  train->add_option("CONFIG", fl.config, "path of the JSON config")->required();
  train->add_option("--nproc,--nproc-per-node", fl.nproc, "ranks to launch on this node (torchrun's "
                                                         "--nproc-per-node); default: the config's train.nproc")
      ->check(CLI::Range(1, 1024));
  train->add_option("--nnodes", fl.nnodes, "nodes of the job (torchrun's name); each runs this command with its "
                                           "own --node-rank")->check(CLI::Range(1, 4096));
  train->add_option("--node-rank", fl.nodeRank, "this node's rank, 0..nnodes-1 (node 0 hosts the store)")
      ->check(CLI::Range(0, 4095));
  train->add_option("--master-addr", fl.masterAddr, "node 0's address, reachable from every node");
  train->add_option("--master-port", fl.masterPort, "the port of node 0's store (default 29500)")
      ->check(CLI::Range(1, 65535));
  train->add_option("--rdzv-id", fl.rdzvId, "the job's id: a node started with another id is refused (torchrun's "
                                            "--rdzv-id); also the run id its checkpoints record");
  train->add_option("--rdzv-timeout", fl.rdzvTimeoutS, "seconds a node waits for the others at each rendezvous "
                                                       "(default 300)")->check(CLI::Range(1.0, 86400.0));
  train->add_option("--set", fl.sets, "override a config key by its dotted path with a JSON value, e.g. "
                                   "--set zero_optimization.stage=3 (repeatable)");
  train->add_option("--metrics", fl.metrics, "write one JSON object per optimizer step to this file (rank 0; "
                                             "appended to when resuming)");
  train->add_flag("--print-program", fl.printProgram, "print the step program before training");
  train->add_option("--trace", fl.trace, "write a Chrome trace-event JSON of every rank (program instructions, "
                                         "collectives, SuperOffload Adam steps, checkpoint writes; open in Perfetto)");
  fl.resumeOption = train->add_option("--resume", fl.resume, "resume from a checkpoint: a step directory, or a root "
                                                             "(its newest complete checkpoint); default: "
                                                             "train.checkpoint.dir")
                        ->expected(0, 1);
  train->add_option("--max-restarts", fl.maxRestarts, "restart the whole job from its newest checkpoint up to N "
                                                      "times when a rank fails (torchrun's --max-restarts)")
      ->check(CLI::Range(0, 1000));
  return train;
}

CLI::App* addExportCommand(CLI::App& app, ExportFlags& f) {
  auto* exp = app.add_subcommand("export", "write a checkpoint's model as a Hugging Face directory (config.json, "
                                           "model.safetensors, the tokenizer), or as one .safetensors file");
  exp->add_option("CKPT", f.ckpt, "a checkpoint directory, or a root (its newest complete checkpoint)")->required();
  exp->add_option("--out", f.out, "the model directory to write (or a file ending in .safetensors: the weights "
                                    "alone)")->required();
  exp->add_option("--dtype", f.dtype, "dtype of the written weights: fp32 (exact) or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  return exp;
}

// CONFIG, --nproc and --set of the commands that read a config without running it (plan, config).
void addConfigOptions(CLI::App* c, PlanFlags& f) {
  c->add_option("CONFIG", f.config, "path of the JSON config")->required();
  c->add_option("--nproc", f.nproc, "ranks the config would run on (default: the config's train.nproc)")
      ->check(CLI::Range(1, 1024));
  c->add_option("--set", f.sets, "override a config key by its dotted path with a JSON value (repeatable)");
}

CLI::App* addPlanCommand(CLI::App& app, PlanFlags& f) {
  auto* plan = app.add_subcommand("plan", "predict each rank's peak memory for a config, or (--max-seq) the "
                                          "longest seq_len within a per-rank budget; runs nothing");
  addConfigOptions(plan, f);
  plan->add_option("--max-seq", f.maxSeq, "per-rank byte budget (4GiB, 512MiB, 1.5GB or plain bytes): print the "
                                        "longest seq_len that fits, and the ablation ladder's");
  return plan;
}

CLI::App* addConfigCommand(CLI::App& app, PlanFlags& f, bool& print) {
  auto* c = app.add_subcommand("config", "check a config (every rule `train` applies) and, with --print, print it "
                                         "with every default filled in, as JSON");
  addConfigOptions(c, f);
  c->add_flag("--print", print, "print the effective config: every key, given or default, as train would use it");
  return c;
}

CLI::App* addInfoCommand(CLI::App& app, int* threads) {
  auto* info = app.add_subcommand("info", "print the CPU, the BLAS kernel and allocator a run gets, the measured "
                                          "GEMM peak, and check the kernel's numerics");
  info->add_option("--threads", *threads, "intra-op threads (default: every core, as one rank trains)")->check(CLI::Range(1, 1024));
  return info;
}

CLI::App* addGenerateCommand(CLI::App& app, GenerateFlags& gf) {
  auto* gen = app.add_subcommand("generate", "generate text from a checkpoint or a Hugging Face directory "
                                            "(KV cache; tokens printed as they come)");
  gen->add_option("MODEL", gf.source, "a checkpoint (step directory or root) or a Hugging Face model directory")
      ->required();
  gen->add_option("--prompt", gf.prompt, "the prompt text (tokenized with the model's tokenizer)");
  gen->add_option("--prompt-ids", gf.promptIds, "the prompt as comma-separated token ids (no tokenizer needed)");
  gen->add_option("--tokenizer", gf.tokenizer, "a tokenizer.json, a SentencePiece .model, or a directory holding one "
                                               "(default: the model directory's, or the run's data.tokenizer)");
  gen->add_option("--max-new-tokens", gf.sampling.maxNewTokens, "tokens to generate (default 64)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  gen->add_option("--temperature", gf.sampling.temperature, "sampling temperature; 0 (default): greedy")
      ->check(CLI::Range(0.0, 100.0));
  gen->add_option("--top-k", gf.sampling.topK, "sample among the K most likely tokens (default: all)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  gen->add_option("--seed", gf.sampling.seed, "seed of the sampling generator (default 1234)");
  gen->add_flag("--ignore-eos", gf.ignoreEos, "keep generating after the tokenizer's EOS");
  return gen;
}

CLI::App* addTokenizeCommand(CLI::App& app, TokenizeFlags& tf) {
  auto* tokenize = app.add_subcommand("tokenize", "turn text files into a token file for data.type uint16/uint32 "
                                                  "(EOS after every document), training the tokenizer first if asked");
  tokenize->add_option("FILE", tf.inputs, "text files (each one document, or split by --split-on)")->required();
  tokenize->add_option("--tokenizer", tf.tokenizer, "a Hugging Face tokenizer.json, a SentencePiece .model, or a "
                                                    "model directory holding one (a .model to write, with "
                                                    "--train-tokenizer)")->required();
  tokenize->add_option("--out", tf.out, "the token file to write (default: the first FILE's name + .bin, here)");
  tokenize->add_option("--split-on", tf.splitOn, "separator between documents inside a file, escapes \\n \\t "
                                                 "(e.g. '%\\n' for fortune files, '\\n\\n' for paragraphs)");
  tokenize->add_option("--train-tokenizer", tf.trainVocab, "first train a tokenizer of this vocabulary size on "
                                                           "the FILEs and write it at --tokenizer")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  tokenize->add_option("--tokenizer-type", tf.tokenizerType, "with --train-tokenizer: unigram (default) or bpe")
      ->check(CLI::IsMember({"unigram", "bpe"}));
  return tokenize;
}

CLI::App* addPlotCommand(CLI::App& app, PlotFlags& f) {
  auto* plot = app.add_subcommand("plot", "plot loss (and eval loss), tokens/s, MFU and peak memory of one or more "
                                          "runs' --metrics files, overlaid, as one SVG (or PNG)");
  plot->add_option("METRICS", f.files, "JSONL files written by `longtrain train --metrics`")->required();
  plot->add_option("--out", f.out, "the image to write: .svg, or .png (needs rsvg-convert, Debian librsvg2-bin)")
      ->required();
  plot->add_option("--label", f.labels, "legend name of each run, in the files' order (repeat once per file; "
                                          "default: the file names)");
  plot->add_flag("--log-loss", f.options.logLoss, "log-scale y axis for the loss panel");
  plot->add_option("--title", f.options.title, "a title above the legend");
  plot->add_option("--width", f.options.width, "image width in pixels (default 1200)")->check(CLI::Range(400, 10000));
  return plot;
}

// A failed command's message on stderr (naming the rank inside a job), exit status 1. An
// allocation failure names the phase it happened in (core/phase.h) and points to `plan`.
int reportFailure(const char* what, bool badAlloc) {
  const int rank = envInt("RANK", 0);
  const bool inJob = std::getenv("WORLD_SIZE") != nullptr;
  const std::string where = inJob ? " on rank " + std::to_string(rank) : "";
  if (badAlloc) {
    std::fprintf(stderr, "longtrain: error%s: out of memory (std::bad_alloc) while %s; `longtrain plan` predicts "
                 "the peak: lower data.seq_len or the micro batch, or spread the state (ZeRO-3, "
                 "sequence_parallel_size)\n", where.c_str(), lt::currentPhase());
    return 1;
  }
  // ATen reports a failed allocation as its own error ("can't allocate memory"): same hint.
  const bool oom = std::strstr(what, "can't allocate memory") != nullptr;
  const std::string text = oom ? lt::firstLine(what) + " (out of memory while " + lt::currentPhase() +
                                     "; `longtrain plan` predicts the peak)"
                               : std::string(what);
  std::fprintf(stderr, "longtrain: error%s: %s\n", where.c_str(), text.c_str());
  return 1;
}

// CLI11's parse with longtrain's exit codes: help and version exit 0, every usage error 1 with
// CLI11's message (its own codes are 105-109). An option given an empty value ("") is refused:
// CLI11 takes `--max-seq ""` as absent, so a script's empty variable would go unnoticed.
// Returns -1 to go on, else the exit status.
int parseCommandLine(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 1;
  }
  for (const CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* o : sub->get_options()) {
      if (o->count() == 0 || o->get_expected_min() == 0) continue;  // absent, or a flag / optional value
      for (const std::string& v : o->results())
        if (v.empty()) {
          std::fprintf(stderr, "longtrain: error: %s %s was given an empty value; give one, or leave the option out "
                       "(see longtrain %s --help)\n", sub->get_name().c_str(), o->get_name().c_str(),
                       sub->get_name().c_str());
          return 1;
        }
    }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  lt::ensureBestBlasKernel(argv);  // may re-execute this program once, before anything runs
  CLI::App app{"longtrain: long-sequence transformer training (Ulysses SP, ZeRO-3/SuperOffload, compile passes)"};
  app.require_subcommand(1);
  TrainFlags trainFlags;
  ExportFlags exportFlags;
  PlanFlags planFlags;
  GenerateFlags generateFlags;
  TokenizeFlags tokenizeFlags;
  PlotFlags plotFlags;
  lt::cli::EvalFlags evalFlags;
  PlanFlags configFlags;
  bool configPrint = false;
  int infoThreads = 0;
  auto* train = addTrainCommand(app, trainFlags);
  auto* exp = addExportCommand(app, exportFlags);
  auto* plan = addPlanCommand(app, planFlags);
  auto* info = addInfoCommand(app, &infoThreads);
  auto* gen = addGenerateCommand(app, generateFlags);
  auto* tokenize = addTokenizeCommand(app, tokenizeFlags);
  auto* plot = addPlotCommand(app, plotFlags);
  auto* eval = lt::cli::addEvalCommand(app, evalFlags);
  auto* config = addConfigCommand(app, configFlags, configPrint);
  if (const int parsed = parseCommandLine(app, argc, argv); parsed >= 0) return parsed;
  // Flush subnormals to zero before any thread pool exists (new threads inherit the mode):
  // training drives some values (softmax tails, Adam's v) subnormal, and x86 then runs
  // those ops ~100x slower. Measured here: tokens/s fell from 10k to 3.7k within 100 steps.
  at::globalContext().setFlushDenormal(true);
  try {
    if (*train) {
      trainFlags.resumeGiven = trainFlags.resumeOption->count() > 0;
      return cmdTrain(argc, argv, trainFlags);
    }
    if (*exp) return cmdExport(exportFlags.ckpt, exportFlags.out, exportFlags.dtype);
    if (*info) return cmdInfo(infoThreads);
    if (*gen) return cmdGenerate(generateFlags);
    if (*plan) return cmdPlan(planFlags.config, planFlags.nproc, planFlags.sets, planFlags.maxSeq);
    if (*plot) return cmdPlot(plotFlags.files, plotFlags.labels, plotFlags.out, plotFlags.options);
    if (*tokenize) return cmdTokenize(tokenizeFlags);
    if (*eval) return lt::cli::cmdEval(evalFlags, argc, argv);
    if (*config) return cmdConfig(configFlags.config, configFlags.nproc, configFlags.sets, configPrint);
  } catch (const std::bad_alloc&) {
    return reportFailure("", true);
  } catch (const std::exception& e) {
    return reportFailure(e.what(), false);
  }
  return 0;
}
