// The optimizer of every ZeRO stage, 0 to 3, with SuperOffload (DeepSpeed stage_1_and_2.py, stage3.py,
// superoffload/). The fp32 master and Adam states of every parameter are partitioned over the
// world (padded to a multiple of it; rank r owns chunk r); stage 2 adds the gradients and
// stage 3 the parameters themselves. Stages 1 and 2 keep the model's full parameters as a
// replica that step() refreshes by all-gathering the updated masters (DeepSpeed's fp16
// partitions); stage 1 lets gradients accumulate whole until the step's last micro-batch and
// reduce-scatters them once, stage 2 reduce-scatters every micro-batch as stage 3 does. One
// class for the four stages, built by the same apply steps in the same order: what differs is
// only where the full copies live. Parameters
// are grouped, in model order, into optimizer sub-groups of at most sub_group_size elements
// (a parameter is never split between sub-groups); each sub-group's fp32 master, gradient
// and Adam state partitions are flat buffers.
// - gather(g) all-gathers block g's parameters into full tensors, in one collective whose
//   parameter-major buffer they become views of; release(g) frees them (stage 3; no-ops at
//   stages 0-2, whose parameters stay whole).
// - reduceGrads(g) hands block g's full gradients to the IPG buckets (one per sub-group,
//   waiting gradients in an O(1) Fifo); a completed bucket is reduce-scattered (async, in
//   pieces of at most reduce_bucket_size elements) into the sub-group's gradient partition,
//   and the full gradients are freed.
// - With super_offload, a sub-group whose gradient is final is stepped at once by the CPU
//   Adam worker (its own pinned cores) while backward goes on, before the global norm and
//   the finite check are known (speculation). step() validates: on a non-finite gradient it
//   rolls every speculated sub-group back and skips the step; above gradient_clipping it
//   rolls back, clips and re-steps. A speculative step writes shadow buffers (master, m, v)
//   and leaves the state as it was; committing swaps the shadows in, rolling back drops them.
//   So rollback is exact (DeepSpeed inverts Adam algebraically, which is not) and costs 12
//   bytes per offloaded parameter and no extra memory traffic.
// Gradients are summed over the world (SP ranks' partial gradients and DP ranks) and
// divided by the DP size. Stage 0 is the replicated case: the state is partitioned over one
// rank, the model's parameters and gradients are views of the sub-groups' flat buffers, and
// the gradients are all-reduced in place instead of reduce-scattered; with SuperOffload a
// committed speculative step re-points the parameters at the new masters.
// Under bf16 GEMMs (ShardedOptimizerOptions::bf16Gathers), a parameter the model reads only
// through them (a Matrix) travels as bf16: CPU Adam writes a bf16 rounding of the master beside
// it in the same pass (a speculative step's is rounded at commit), gathers and replica refreshes
// move those copies (half the bytes) and widen them to fp32 on arrival (a stage 3 gather in its own buffer, so it takes no more memory than an fp32 one).
// The GEMMs round their operands to bf16 anyway (to nearest even, as Adam does), so the result
// is bit for bit that of gathering the fp32 masters. Gradients stay fp32 unless reduceBf16.
#pragma once
#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "longtrain/comm/comm.h"
#include "longtrain/config/config.h"
#include "longtrain/core/channel.h"
#include "longtrain/core/fifo.h"
#include "longtrain/core/partition.h"
#include "longtrain/kernels/cpu_adam.h"
#include "longtrain/model/model.h"
#include "longtrain/zero/ipg_bucket.h"

namespace lt::zero {

// buf (fp32) holds n bf16 values in its first 2n bytes; widens them in place to n floats (exact),
// so a bf16 gather needs no second buffer. Float i overwrites bf16 values 2i and 2i + 1: waves
// run downwards, wave [lo, hi) with 2 lo >= hi writing only values earlier waves (or none) held.
void widenBf16InPlace(const at::Tensor& buf, int64_t n);

struct ShardedOptimizerOptions {
  int stage = 3;                     // 0 (replicated, all-reduce), 1, 2 or 3
  int64_t subGroupSize = 1000000000;
  int64_t reduceBucketSize = 500000000;     // elements per reduce-scatter (whole parameters)
  int64_t allgatherBucketSize = 500000000;  // elements per all-gather refreshing stage 1/2 replicas
  bool overlapComm = true;           // false: wait for each collective as it is issued
  // Decoupled (AdamW) or L2 weight decay, adam.weightDecay, by each parameter's role: matrices
  // decay, norms and biases never, the token embedding (a tied LM head with it) only with this.
  bool decayEmbeddings = false;
  // The model's GEMMs run in bf16: its matrices travel as bf16 copies (see above). false: every
  // parameter travels as fp32.
  bool bf16Gathers = false;
  // communication_data_type "bf16": each rank's gradient pieces are rounded to bf16 for the
  // reduce-scatter (half the bytes) and summed in fp32 on arrival.
  bool reduceBf16 = false;
  double gradientClipping = 0;   // 0: off
  kernels::AdamParams adam;
  bool superOffload = false;     // speculative CPU Adam on a worker during backward
  double ratio = 1.0;            // share of sub-groups the worker steps (the rest step in step())
  int workerCores = 1;           // CPU Adam threads (cpuadam_cores_perc x the rank's cores)
  std::vector<int> workerCpus;   // CPUs to pin the worker to (empty: no pinning)
  std::chrono::milliseconds workerTimeout{60000};

  // What the config gives (zero_optimization, optimizer, gradient_clipping, communication_data_type)
  // for a rank running `threads` intra-op threads on `rankCpus`: with SuperOffload the worker
  // gets its share of them (pinned to the last of the CPUs when they are known) and the caller
  // keeps threads - workerCores. The per-parameter vectors are the caller's to fill.
  // bf16Gemms: the run plan's choice (the model's GEMMs run in bf16).
  static ShardedOptimizerOptions from(const config::Config& cfg, bool bf16Gemms, int threads, const std::vector<int>& rankCpus);
};

// Bytes this rank holds, by kind (the memory ledger).
struct Ledger {
  int64_t paramBytes = 0;      // fp32 master partitions (and their bf16 copies, bf16Gathers)
  int64_t gradBytes = 0;       // fp32 gradient partitions
  int64_t optimBytes = 0;      // Adam m and v partitions
  int64_t rollbackBytes = 0;   // shadow master, m, v for exact rollback (super_offload only)
  int64_t replicaBytes = 0;    // stages 1 and 2: the model's full parameters
  int64_t gatheredBytes = 0;   // full parameters gathered or in flight right now (stage 3: the
                               // gathers' buffers, each parameter padded to world x its chunk)
  int64_t gatheredPeakBytes = 0;
  int64_t unpartitionedBytes = 0;  // params + grads + Adam states of the whole model, fp32
};

struct ZeroStepResult {
  double gradNorm = 0;
  bool skipped = false;      // non-finite gradient: nothing changed
  int speculated = 0;        // sub-groups stepped speculatively
  int rolledBack = 0;
  double waitSeconds = 0;     // step() waiting for reduce-scatters and the worker
  double adamSeconds = 0;     // step() running Adam itself (sub-groups not speculated, re-steps)
  double workerAdamSeconds = 0;      // the worker's speculative Adam steps
};

class ShardedOptimizer {
 public:
  ShardedOptimizer(const model::Model& m, std::shared_ptr<comm::Comm> world, int dpSize, ShardedOptimizerOptions o);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // Makes group g's parameters whole: waits for a prefetch, or gathers now.
  void gather(int group);
  // Starts gathering group g asynchronously (a later gather(g) waits for it).
  void prefetch(int group);
  void release(int group);
  void releaseAll();  // step() calls it: a gathered copy is stale once masters change
  // boundary: the last micro-batch of the optimizer step (gradients become final).
  void reduceGrads(int group, bool boundary);
  // After every micro-batch's backward (the engine calls it when the executor returns): sends
  // the buckets still partly filled. Called with the micro-batch's `boundary`.
  void finishBackward(bool boundary);
  // lr is the learning rate of the step being taken; call setLr before backward so that
  // speculative steps use it.
  void setLr(double lr);
  ZeroStepResult step();
  // After masters changed outside step() (a checkpoint or init_from load): remakes the bf16
  // copies, and at stages 1 and 2 refreshes the full parameters. Collective; every rank calls it
  // at the same point, before the next gather (the engine: at the start of step and evaluate).
  void syncParameters();

  const Ledger& ledger() const { return ledger_; }
  int numSubGroups() const { return static_cast<int>(subGroups_.size()); }
  int64_t skippedSteps() const { return skipped_; }
  // This rank's fp32 partition of every parameter, gathered to full tensors (for tests).
  std::vector<at::Tensor> fullParameters();
  // Injects a value into this rank's gradient partition of sub-group sg at the next step
  // boundary (testing hook for the rollback path).
  void injectGradValue(int subGroup, float value) { inject_ = {subGroup, value}; }
  kernels::CpuAdam& adam() { return *adam_; }
  // Checkpoint state: this rank's chunk of every parameter (empty chunks left out).
  std::vector<StateShard> stateShards();  // pointing into the masters and Adam buffers
  const std::vector<int64_t>& paramShape(int param) const { return params_.at(param).shape; }
  int64_t adamStepCount() const;  // equal across sub-groups (a skipped step skips them all)
  // Before loading: zeroes master, m and v (padding included), sets every sub-group's step
  // count and drops gathered copies; the caller then fills stateShards().
  void resetState(int64_t adamStep, int64_t skippedSteps);
  int stage() const { return o_.stage; }
  at::Tensor masterPartition(int sg) { return subGroups_[sg].master; }

 private:
  struct ParamInfo {
    int group, subGroup;
    at::Tensor tensor;  // the model's parameter (full between gather and release)
    std::vector<int64_t> shape;
    int64_t numel, chunk;  // chunk = ceil(numel / world)
    int64_t offset;        // of this parameter's chunk in its sub-group's flat partition
    bool bf16 = false;     // gathered from the sub-group's bf16 copy
    double weightDecay = 0;
  };
  struct SubGroup {
    std::vector<int> params;
    int64_t partNumel = 0;   // sum of the params' chunks
    at::Tensor master, grad; // [partNumel] fp32
    at::Tensor masterBf16;   // [partNumel] bf16 rounding of master; only with a bf16 parameter
    at::Tensor shadowMaster;  // the speculative step's output (super_offload)
    int adamGroup = -1;
    bool offloaded = false;  // stepped by the worker
    bool speculated = false; // stepped this step, not validated yet
  };
  struct PendingReduce {
    int subGroup;
    bool boundary;
    bool last;        // the sub-group's last piece
    int64_t offset;   // of the piece in the sub-group's partition
    at::Tensor recv;  // [piece length]
    comm::Work work;
  };
  // Parameters [first, last) of a sub-group: a run of whole parameters sent as one collective.
  struct Run {
    int first, last;
    int64_t offset, length;  // in the sub-group's partition
  };
  struct Task {
    int subGroup;
  };
  // One group's gather: params' full tensors lie in `buffer` in this order, each at its
  // [W * chunk] place (a bf16 one received into its place's first half).
  struct PendingGather {
    std::vector<int> params;
    at::Tensor buffer;  // [sum of W * chunk] fp32
    comm::Work work;
  };

  // The construction steps, in their order (see the constructor).
  void applyPartitioning(const model::Model& m);
  void applyOptimizerState();
  void applyOwnership();
  void applyGradientBuckets();
  void applyOffloadWorker();
  // byDtype: a run never mixes bf16 and fp32 parameters (gathers; a reduce-scatter's dtype is
  // the same for every parameter).
  std::vector<Run> runs(const SubGroup& sg, int64_t maxElements, bool byDtype) const;
  void gatherReplicas();
  void aliasReplicas();  // stage 0
  void allReduceInPlace(int sg);  // stage 0's bucket
  double squaredGradNorm();
  bool handsOver(bool boundary) const;  // whether this micro-batch's gradients go to the buckets
  // Ranks the state is partitioned over (1 at stage 0: replicated), and this rank's index.
  int partitions() const { return o_.stage == 0 ? 1 : world_->size(); }
  int partitionRank() const { return o_.stage == 0 ? 0 : world_->rank(); }
  void refreshBf16Copies();  // syncParameters(), after masters were written outside Adam (a load)
  comm::Work issue(comm::Work w);
  void onBucket(int sg, std::vector<GradItem>& items);
  void pollReduces(bool block);
  void finishReduce(PendingReduce& r);
  void gradFinal(int sg);
  void stepSubGroup(int sg);     // a committed Adam step (trainer side)
  void stepSpeculative(int sg);  // worker side: into the shadows
  void workerLoop();
  void drainResults(int expected);

  std::shared_ptr<comm::Comm> world_;
  int dpSize_;
  ShardedOptimizerOptions o_;
  std::vector<ParamInfo> params_;
  std::vector<std::vector<int>> groupParams_;  // model group -> param indices
  std::vector<std::vector<PendingGather>> pendingGathers_;  // per group, from prefetch()
  std::vector<int64_t> gatheredGroupBytes_;  // per group: its completed gathers' buffers (until release)
  std::vector<SubGroup> subGroups_;
  std::unique_ptr<kernels::CpuAdam> adam_;
  std::unique_ptr<IpgBuckets> buckets_;
  Fifo<PendingReduce> pending_;
  bool boundary_ = false;
  int dispatched_ = 0;
  Ledger ledger_;
  int64_t skipped_ = 0;
  std::optional<std::pair<int, float>> inject_;
  bool replicasStale_ = false;  // stages 1 and 2: masters changed since the last all-gather
  bool bf16Stale_ = false;      // masters changed outside Adam since the bf16 copies were made

  Channel<Task> tasks_;
  Channel<int> results_;  // sub-group ids stepped by the worker (-1 - sg on failure)
  std::thread worker_;
  std::atomic<int64_t> workerAdamNs_{0};  // this step, summed over tasks
};

}  // namespace lt::zero
