// The training engine: builds the model, groups, loader, optimizer and step program from a
// Config and its RunPlan, and runs optimizer steps. One optimizer serves every ZeRO stage
// (zero/sharded_optimizer.h): stage 0 is its replicated case, whose parameters and gradients are views of
// flat buffers that are all-reduced in place; stages 1-3 partition. The program's ReduceGrads
// hand each group's gradients over as its backward ends (overlapping the next group's); the
// engine calls finishBackward after every micro-batch and steps after the last one, where the
// program's OptimizerStep stands. Summing over the world adds SP ranks' partial gradients and
// DP ranks' gradients; dividing by the DP size makes the DP average.
#pragma once
#include <chrono>
#include <memory>
#include <optional>

#include "longtrain/ckpt/train_state.h"
#include "longtrain/comm/comm.h"
#include "longtrain/compile/executor.h"
#include "longtrain/compile/passes.h"
#include "longtrain/compile/program.h"
#include "longtrain/compile/schedule.h"
#include "longtrain/config/config.h"
#include "longtrain/data/data.h"
#include "longtrain/kernels/cpu_adam.h"
#include "longtrain/model/model.h"
#include "longtrain/sp/ulysses.h"
#include "longtrain/config/run_plan.h"
#include "longtrain/zero/sharded_optimizer.h"

namespace lt::train {

using config::Config;

struct StepMetrics {
  int64_t step = 0;        // 1-based index of the optimizer step just taken
  double loss = 0;         // mean token loss over the global batch
  double lr = 0;           // the learning rate this step used
  double gradNorm = 0;     // global L2 norm before clipping
  double accuracy = 0;     // argmax accuracy over the scored tokens of the global batch
  int64_t tokens = 0;      // tokens processed by all ranks in this step
  double stepTimeS = 0;
  int64_t peakRssBytes = 0;  // max over ranks
  zero::ZeroStepResult zero;  // ZeRO stages 1-3: skip, speculation and optimizer timings
  double exposedGatherS = 0;     // time the first micro-batch waited in Gather instructions
  int64_t activationPeakBytes = 0;  // kept block inputs on the device, at their peak
  double offloadWaitS = 0, offloadIoS = 0;  // train.offload_dir: blocked on the file; the I/O thread's copies
};

struct EvalMetrics {
  double loss = 0, accuracy = 0;
  int64_t tokens = 0;
};

// What the engine takes from the process it runs in (the CLI fills it; tests leave it empty).
struct EngineOptions {
  // The CPUs this rank owns (process ranks: cores [l x c, (l + 1) x c) of local rank l); the
  // SuperOffload worker is pinned to the last of them. Empty: no pinning.
  std::vector<int> rankCpus;
  // The ranks sharing this host's memory (the memory budget's divisor); 0: the world's size.
  int localRanks = 0;
};

// Compares the plan's agreed fields over the world (collective); a mismatch is an lt::Error
// naming the first field that differs.
void agreeOnPlan(const config::RunPlan& plan, comm::Comm& world);

class Engine : public ckpt::TrainState {
 public:
  Engine(const Config& cfg, comm::Groups groups, EngineOptions opts = {});
  ~Engine() override;

  StepMetrics step();
  EvalMetrics evaluate();

  const model::Model& model() const { return *model_; }
  model::Model& model() { return *model_; }
  // Every parameter, whole (under ZeRO gathered from the master partitions: a collective).
  std::vector<at::Tensor> fullParameters();
  zero::ShardedOptimizer* zero() { return zero_.get(); }
  // Called on every rank when a schedule entry rebuilds the program (0-based step).
  std::function<void(int64_t step, const std::vector<std::string>& passes, const compile::Program&)> onRecompile;
  const std::vector<std::string>& activePasses() const { return activePasses_; }
  const compile::Program& program() const { return program_; }
  const compile::ActivationOffload* activationOffload() const { return offload_.get(); }  // null: none
  // This rank's GEMM rate for the dtype the model computes in, if construction measured it
  // (bf16.enabled); 0 otherwise.
  double measuredGemmPeakFlops() const { return gemmPeakFlops_; }
  const comm::Groups& groups() const { return groups_; }
  const data::Dataset& dataset() const { return *train_; }
  const data::Dataset* evalDataset() const { return eval_.get(); }  // null without eval samples
  // activation_checkpointing's choice: the last graphBlocks() blocks keep their autograd graph.
  int graphBlocks() const { return plan_.graphBlocks; }
  int64_t memoryBudget() const { return plan_.memoryBudget; }  // per rank, what "auto" chose against
  // The choices resolved at start (GEMM route, bf16, recompute, budget); config() stays as given.
  const config::RunPlan& plan() const { return plan_; }

  // ckpt::TrainState (checkpoints save and restore through it).
  const Config& config() const override { return cfg_; }
  comm::Comm& world() override { return *groups_.world; }
  int64_t globalStep() const override { return step_; }
  std::vector<ckpt::ParamMeta> parameterMeta() const override;
  bool statePartitioned() const override { return zero_->stage() > 0; }
  std::vector<StateShard> stateShards() override;
  int64_t adamStepCount() const override;
  int64_t skippedSteps() const override { return zero_->skippedSteps(); }
  int64_t loaderCursor() const override;
  void resetToStep(int64_t step, int64_t adamStep, int64_t skippedSteps) override;

 private:
  // Construction, in order.
  void buildLoader();
  void buildOptimizer(const EngineOptions& opts);
  void buildProgram();
  void buildExecutor();
  bool chooseBf16();  // bf16.enabled: whether the bf16 GEMM is faster on every rank (collective)
  bool chooseBf16Attention();  // bf16.attention: whether its tile products are faster on every rank (collective)
  void chooseTiling();      // collective: "auto" loss_chunk / tiled_mlp, the most any rank needs
  int chooseGraphBlocks();  // collective: every rank takes the smallest choice
  void loadInitialWeights();  // model.init_from's safetensors into this rank's state
  void makeActivationOffload();  // train.offload_dir: this rank's file, for the program's offloaded blocks

  data::Batch nextMicroBatch();  // with shift_labels; this rank's shard under SP
  void recompile(const std::vector<std::string>& passes, int64_t step);
  void optimizerStep();
  void keepWithinBudget();  // after a step: decommit from now on if the resident set nears the budget

  const Config cfg_;  // as given: measured choices live in plan_
  config::RunPlan plan_;
  comm::Groups groups_;
  std::unique_ptr<model::Model> model_;
  std::shared_ptr<const data::Dataset> train_, eval_;
  std::unique_ptr<data::Loader> loader_;         // SP = 1
  std::unique_ptr<sp::UlyssesLoader> ulysses_;  // SP > 1 (owns this rank's loader)
  data::Loader* spLoader_ = nullptr;             // SP > 1: the loader inside ulysses_
  std::unique_ptr<zero::ShardedOptimizer> zero_;  // the optimizer, at every ZeRO stage (0: replicated)
  zero::ZeroStepResult lastZero_;
  double gemmPeakFlops_ = 0;  // this rank's rate of the GEMM dtype in use, when chooseBf16 measured it
  compile::Program base_, program_;
  compile::Schedule schedule_;
  compile::PassContext passCtx_;
  compile::Profile lastProfile_;
  std::vector<std::string> activePasses_;
  std::unique_ptr<compile::ActivationOffload> offload_;  // train.offload_dir; outlives exec_
  std::unique_ptr<compile::Executor> exec_;

  int64_t step_ = 0;
  bool watchResident_ = false;  // a budget whose run keeps freed spans: keepWithinBudget may decommit
  double lastGradNorm_ = 0, lastLr_ = 0;
};

// Builds the dataset a config names (train split, or the eval split with its own seed).
std::shared_ptr<const data::Dataset> makeDataset(const Config& cfg, bool eval);

}  // namespace lt::train
