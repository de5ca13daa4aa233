// The training loop around Engine: progress lines and the metrics JSONL on world rank 0,
// evaluation every `train.eval_every` steps and at the end, checkpoints on their cadence and on a
// stop signal. The JSONL schema (MetricsWriter, trainer.cpp) is in the README.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "longtrain/comm/comm.h"
#include "longtrain/train/engine.h"

namespace lt::train {

struct TrainOptions {
  std::string metricsPath;  // empty: no JSONL
  std::string tracePath;    // empty: no trace; else Chrome trace-event JSON of every rank (rank 0 writes)
  bool printProgram = false;
  std::vector<int> faultKillRanks;  // testing hook: these world ranks SIGKILL themselves ...
  int64_t faultKillStep = -1;  // ... when it reaches this step
  // Resume from this checkpoint (a step directory, or a root: its newest complete one).
  std::string resume;
  // A restarted job (launcher --max-restarts): resume from the newest complete checkpoint
  // under train.checkpoint.dir if there is one (it wins over `resume`), else as configured.
  bool restarted = false;
  std::string runId;  // the launch (LONGTRAIN_RUN_ID): recorded in manifests, matched on restart
  // Called at each stage of every checkpoint save (ckpt::StageHook; fault injection).
  std::function<void(const std::string&)> checkpointHook;
  EngineOptions engine;  // what the engine takes from the process (its CPUs)
};

struct TrainSummary {
  double finalLoss = 0, evalLoss = 0, evalAccuracy = 0, tokensPerS = 0;
  int64_t evalTokens = 0;  // 0: no evaluation ran (no eval set), and evalLoss means nothing
  int64_t steps = 0;
  int64_t firstStep = 0;         // 0, or the step resumed from
  double checkpointSeconds = 0;  // spent saving checkpoints
  int stopSignal = 0;            // SIGTERM / SIGINT ended the run early (after a checkpoint)
  int64_t failedSaves = 0;       // checkpoint saves that failed (train.checkpoint.on_error "warn")
};

TrainSummary runTraining(const Config& cfg, comm::Groups groups, const TrainOptions& opts);

}  // namespace lt::train
