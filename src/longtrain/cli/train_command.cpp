// `longtrain train`: validates the config once, then either launches the job's local ranks
// (--nproc, several nodes, restarts) or, inside a rank (a torchrun-style environment), brings
// the rank up (comm/bring_up.h) and trains. Non-obvious: everything that can be refused is
// checked before launching, so an error is reported once, not once per rank.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "longtrain/cli/command.h"
#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/comm/bring_up.h"
#include "longtrain/comm/launch.h"
#include "longtrain/config/parse.h"
#include "longtrain/core/check.h"
#include "longtrain/core/strings.h"
#include "longtrain/core/stop.h"
#include "longtrain/offload/activation_file.h"
#include "longtrain/plan/preflight.h"
#include "longtrain/train/inputs.h"
#include "longtrain/train/process_baseline.h"
#include "longtrain/train/trainer.h"

namespace lt::cli {

namespace {

struct TrainFlags {
  std::string config, metrics, resume, trace, fit, linkBandwidth;
  bool printProgram = false;
  int nproc = 0;  // per node; 0: the config's train.nproc
  int maxRestarts = 0;
  int nnodes = 1, nodeRank = 0, masterPort = 29500;
  double rdzvTimeoutS = 900;  // torchrun's default
  std::string masterAddr, rdzvId;
  std::vector<std::string> sets;
  CLI::Option* resumeOption = nullptr;  // --resume given (with or without a directory)
};

// "--set", s for each of `sets`: command-line arguments.
std::vector<std::string> asSetFlags(const std::vector<std::string>& sets) {
  std::vector<std::string> args;
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

// --fit across nodes: node 0 chooses for the job (comm::LaunchOptions::chooseOnNodeZero), with the
// link --link-bandwidth gives or node 1 measures, and every node's ranks run that choice.
void fitOnNodeZero(comm::LaunchOptions& lo, const TrainFlags& fl, int nproc) {
  const plan::Placement at{nproc * fl.nnodes, nproc};
  const int64_t budget = parseByteSize(fl.fit, "--fit");
  const double given = fl.linkBandwidth.empty() ? 0 : 1 / parseLinkRate(fl.linkBandwidth, "--link-bandwidth");
  lo.measureLink = given == 0;
  lo.chooseOnNodeZero = [fl, at, budget, given](double measured) {
    const auto args = asSetFlags(fitSets(fl.config, fl.sets, at, given > 0 ? given : measured, budget, "train runs it with:"));
    std::fflush(stdout);
    return args;
  };
}

// Several nodes (--nnodes, --master-addr) or several local ranks: this process launches.
int launchRanks(const std::vector<std::string>& args, const TrainFlags& fl, const config::Config& cfg, int nproc) {
  comm::LaunchOptions lo;
  if (!fl.fit.empty() && fl.nnodes > 1) fitOnNodeZero(lo, fl, nproc);  // one node chose before launching
  lo.nprocPerNode = nproc;
  lo.nnodes = fl.nnodes;
  lo.nodeRank = fl.nodeRank;
  lo.masterAddr = fl.masterAddr;
  lo.masterPort = fl.masterPort;
  lo.rdzvId = fl.rdzvId;
  lo.rdzvTimeout = std::chrono::milliseconds(static_cast<int64_t>(fl.rdzvTimeoutS * 1000));
  lo.grace = std::chrono::milliseconds(cfg.train.commTimeoutMs() + 10000);
  lo.maxRestarts = fl.maxRestarts;
  return comm::launch(args, lo);
}

// LONGTRAIN_FAULT_KILL_RANK: one rank, or several ("1,2").
std::vector<int> faultKillRanks() {
  std::vector<int> ranks;
  const char* v = std::getenv("LONGTRAIN_FAULT_KILL_RANK");
  std::istringstream in(v ? v : "");
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) ranks.push_back(std::atoi(item.c_str()));
  return ranks;
}

// Fault injection (tests) fires on the first attempt only, so a restarted job can finish.
void addFaultHooks(train::TrainOptions& to, int rank) {
  to.faultKillRanks = faultKillRanks();
  to.faultKillStep = comm::envInt("LONGTRAIN_FAULT_KILL_STEP", -1);
  const char* stage = std::getenv("LONGTRAIN_FAULT_CKPT_STAGE");
  if (!stage || !*stage) return;
  // This rank dies at that stage of its n-th save (LONGTRAIN_FAULT_CKPT_SAVE, default 1).
  const bool me = to.faultKillRanks.empty() ? rank == 0 : std::count(to.faultKillRanks.begin(), to.faultKillRanks.end(), rank) > 0;
  const int nth = comm::envInt("LONGTRAIN_FAULT_CKPT_SAVE", 1);
  to.checkpointHook = [st = std::string(stage), me, nth, saves = 0](const std::string& s) mutable {
    if (s == "rank_file_fsynced") ++saves;  // the first stage of every save, on every rank
    if (me && s == st && saves == nth) ::raise(SIGKILL);
  };
}

train::TrainOptions trainOptions(const TrainFlags& fl, const std::string& resume, int rank) {
  train::TrainOptions to;
  to.metricsPath = fl.metrics;
  to.tracePath = fl.trace;
  to.printProgram = fl.printProgram;
  to.resume = resume;
  const int attempt = comm::envInt("LONGTRAIN_RESTART_ATTEMPT", 0);
  to.restarted = attempt > 0;
  if (const char* id = std::getenv("LONGTRAIN_RUN_ID")) to.runId = id;
  if (attempt == 0) addFaultHooks(to, rank);
  return to;
}

// Inside a rank: bring it up, train, report.
int runRank(const config::Config& cfg, const TrainFlags& fl, const std::string& resume) {
  installStopHandlers(!cfg.train.checkpoint.dir.empty(), comm::envInt("LOCAL_RANK", 0) == 0);
  comm::BringUpOptions bo;
  bo.sequenceParallel = cfg.sequenceParallelSize;
  bo.ringDegree = cfg.layout.R;
  bo.timeout = std::chrono::milliseconds(cfg.train.commTimeoutMs());
  bo.threads = cfg.train.threads;
  bo.agreed = config::agreedKeys(cfg);
  comm::RankSetup rank = comm::bringUp(bo);
  train::rankProcessBaseline(rank.rendezvous.size, rank.rendezvous.localSize, cfg.train.threads);  // what "auto" recompute plans against
  train::TrainOptions to = trainOptions(fl, resume, rank.rendezvous.rank);
  to.engine.rankCpus = rank.cpus;
  to.engine.localRanks = rank.rendezvous.localSize;
  auto s = train::runTraining(cfg, rank.groups, to);
  if (rank.rendezvous.rank == 0 && !s.stopSignal)
    std::printf("done: %lld steps, final loss %.4f%s, %.0f tokens/s\n", (long long)s.steps, s.finalLoss,
                s.evalTokens > 0 ? fmt::format(", eval loss {:.4f}, eval accuracy {:.3f}", s.evalLoss, s.evalAccuracy).c_str() : "",
                s.tokensPerS);
  rank.groups.world->barrier();  // nobody tears down its process group while a peer still needs it
  return s.stopSignal ? 128 + s.stopSignal : 0;
}

// What train refuses before launching: memory, the resume source, the directories it writes.
// `fitLater`: node 0 chooses after launch (--fit across nodes), and the ranks check its choice.
std::string checkBeforeLaunch(const config::Config& cfg, const TrainFlags& fl, bool inRank, int world, int nproc,
                              bool fitLater) {
  const int localRanks = inRank ? comm::envInt("LOCAL_WORLD_SIZE", 1) : nproc;
  plan::preflightCounts(cfg, localRanks);
  if (!fitLater) plan::preflightMemory(cfg, world, localRanks);
  std::string resume = fl.resume;
  if (fl.resumeOption->count() > 0 && resume.empty()) {
    resume = cfg.train.checkpoint.dir;
    LT_CHECK(!resume.empty(), "--resume without a directory needs train.checkpoint.dir in the config");
  }
  if (!resume.empty() && !inRank) (void)ckpt::resolve(resume, "--resume");  // fail before launching anything
  if (!inRank && !cfg.train.checkpoint.dir.empty()) ckpt::checkWritable(cfg.train.checkpoint.dir, "train.checkpoint.dir");
  if (!inRank && !cfg.train.offloadDir.empty()) (void)offload::checkOffloadDir(cfg.train.offloadDir);
  LT_CHECK(fl.maxRestarts == 0 || !cfg.train.checkpoint.dir.empty(), "--max-restarts ", fl.maxRestarts,
           " needs train.checkpoint.dir (and every_steps), or a restart would start over from step 0");
  return resume;
}

// The command line without --fit BUDGET and --link-bandwidth RATE, with the choice's --set flags
// after it: what the ranks run.
std::vector<std::string> withFitApplied(int argc, char** argv, const std::vector<std::string>& chosen) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fit" || a == "--link-bandwidth") ++i;
    else if (a.rfind("--fit=", 0) != 0 && a.rfind("--link-bandwidth=", 0) != 0) args.push_back(a);
  }
  const auto flags = asSetFlags(chosen);
  args.insert(args.end(), flags.begin(), flags.end());
  return args;
}

int runTrain(int argc, char** argv, TrainFlags fl) {
  const bool inRank = std::getenv("WORLD_SIZE") != nullptr;
  std::vector<std::string> args(argv, argv + argc);
  LT_CHECK(fl.linkBandwidth.empty() || (!fl.fit.empty() && fl.nnodes > 1), "--link-bandwidth prices --fit's "
           "choices across nodes; without --fit and --nnodes above 1 it does nothing: drop it");
  const bool fitLater = !fl.fit.empty() && fl.nnodes > 1;
  if (!fl.fit.empty()) {
    LT_CHECK(!inRank, "--fit is chosen by longtrain's own launcher, once for all its ranks; under another launcher, run "
             "`longtrain plan CONFIG --nproc N [--nnodes M --link-bandwidth RATE] --fit ", fl.fit,
             "` and pass the --set flags it prints");
    (void)parseByteSize(fl.fit, "--fit");  // every node refuses a bad value before it launches
    if (!fl.linkBandwidth.empty()) (void)parseLinkRate(fl.linkBandwidth, "--link-bandwidth");
    std::vector<std::string> chosen;
    if (!fitLater) {
      const int nproc = nprocOf(config::loadConfigJson(fl.config, fl.sets), fl.nproc);
      chosen = fitSets(fl.config, fl.sets, plan::Placement::oneNode(nproc), 0, parseByteSize(fl.fit, "--fit"),
                       "train runs it with:");
      std::fflush(stdout);
      fl.sets.insert(fl.sets.end(), chosen.begin(), chosen.end());
    }
    args = withFitApplied(argc, argv, chosen);
  }
  nlohmann::json j = config::loadConfigJson(fl.config, fl.sets);
  const int nproc = nprocOf(j, fl.nproc);
  const int world = inRank ? comm::envInt("WORLD_SIZE", 1) : nproc * fl.nnodes;
  const config::Config cfg = config::parseConfig(j, world);
  if (!inRank)  // once per node: the launcher's, or the only process's
    for (const auto& line : cfg.notices) std::printf("longtrain: %s\n", line.c_str());
  std::fflush(stdout);  // before any rank's output
  const std::string resume = checkBeforeLaunch(cfg, fl, inRank, world, nproc, fitLater);
  if (!inRank && (nproc > 1 || fl.maxRestarts > 0 || fl.nnodes > 1 || !fl.masterAddr.empty())) {
    train::checkInputs(cfg);  // once here, not once per rank
    return launchRanks(args, fl, cfg, nproc);
  }
  return runRank(cfg, fl, resume);
}

void addLaunchOptions(CLI::App* train, TrainFlags& fl) {
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
  train->add_option("--rdzv-timeout", fl.rdzvTimeoutS, "seconds a node retries node 0's store and waits for "
                                                       "the other nodes, at start and at each restart (default 900, "
                                                       "torchrun's)")->check(CLI::Range(1.0, 86400.0));
}

}  // namespace

Command trainCommand(CLI::App& app, int argc, char** argv) {
  auto fl = std::make_shared<TrainFlags>();
  auto* train = app.add_subcommand("train", "train a model from a JSON config (DeepSpeed key names)");
  train->add_option("CONFIG", fl->config, "path of the JSON config")->required();
  addLaunchOptions(train, *fl);
  train->add_option("--set", fl->sets, "override a config key by its dotted path with a JSON value, e.g. "
                                       "--set zero_optimization.stage=3 (repeatable)");
  train->add_option("--fit", fl->fit, "per-rank byte budget (4GiB, 512MiB): choose the layout, ZeRO stage, tiling, "
                                      "micro-batch split and recompute set that fit it and are predicted fastest "
                                      "(as plan --fit), and train with them; across nodes node 0 chooses for all");
  train->add_option("--link-bandwidth", fl->linkBandwidth, "with --fit across nodes: the link between nodes "
                                                            "(10Gbit/s, 1.25GB/s); default: node 1 measures it");
  train->add_option("--metrics", fl->metrics, "write one JSON object per optimizer step to this file (rank 0; "
                                              "appended to when resuming)");
  train->add_flag("--print-program", fl->printProgram, "print the step program before training");
  train->add_option("--trace", fl->trace, "write a Chrome trace-event JSON of every rank (program instructions, "
                                          "collectives, SuperOffload Adam steps, checkpoint writes; open in Perfetto)");
  fl->resumeOption = train->add_option("--resume", fl->resume, "resume from a checkpoint: a step directory, or a "
                                                               "root (its newest complete checkpoint); default: "
                                                               "train.checkpoint.dir")
                         ->expected(0, 1);
  train->add_option("--max-restarts", fl->maxRestarts, "restart the whole job from its newest checkpoint up to N "
                                                       "times when a rank fails (torchrun's --max-restarts)")
      ->check(CLI::Range(0, 1000));
  return {train, [fl, argc, argv] { return runTrain(argc, argv, *fl); }};
}

}  // namespace lt::cli
