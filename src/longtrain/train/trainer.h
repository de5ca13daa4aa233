// The training loop around Engine: progress lines and the metrics JSONL on world rank 0,
// evaluation every `train.eval_every` steps and at the end. The JSONL schema is in the README.
#pragma once
#include <string>

#include "longtrain/comm/comm.h"
#include "longtrain/train/config.h"

namespace lt::train {

struct TrainOptions {
  std::string metricsPath;  // empty: no JSONL
  bool printProgram = false;
  int faultKillRank = -1;   // testing hook: this world rank SIGKILLs itself ...
  int64_t faultKillStep = -1;  // ... when it reaches this step
};

struct TrainSummary {
  double finalLoss = 0, evalLoss = 0, evalAccuracy = 0, tokensPerS = 0;
  int64_t steps = 0;
};

TrainSummary runTraining(const Config& cfg, comm::Groups groups, const TrainOptions& opts);

}  // namespace lt::train
