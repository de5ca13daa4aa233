// The run configuration: one JSON file with DeepSpeed's key names wherever DeepSpeed has the
// setting, plus sections `model`, `data`, `train`. Each section is a plain struct whose
// member initializers are the defaults, declared once: the parser (config/parse.h) reads
// the file over a default-constructed Config, and validate (config/validate.h) applies every
// rule that spans keys or needs the world size, for every entry point (train, plan, the
// launcher, the tests). Every key is documented in the README's configuration reference.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "longtrain/config/model_config.h"
#include "longtrain/config/options.h"
#include "longtrain/config/parallel_layout.h"

namespace lt::config {

struct OptimizerConfig {
  OptimizerType type = OptimizerType::AdamW;
  // optimizer.params.adam_w_mode (DeepSpeed's, default true): "Adam" decays weights as AdamW
  // does (decoupled); false adds the decay to the gradient (L2). "AdamW" always decouples.
  bool adamWMode = true;
  bool decoupledDecay() const { return type == OptimizerType::AdamW || adamWMode; }
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.01;
  bool decayEmbeddings = false;  // weight decay on the token embedding (matrices decay, norms never)
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::Constant;  // no scheduler section: the constant lr
  // WarmupLR
  double warmupMinLr = 0, warmupMaxLr = -1;  // -1: the optimizer's lr
  int64_t warmupNumSteps = 1000;
  WarmupType warmupType = WarmupType::Log;
  // WarmupDecayLR (linear decay to 0) and WarmupCosineLR: the step the decay ends at
  int64_t totalNumSteps = 0;
  // WarmupCosineLR
  double warmupMinRatio = 0, cosMinRatio = 1e-4;
};

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::None;
  bool superOffload = false;
  double ratio = 1.0, cpuadamCoresPerc = 0.8;
};

// Every precision key in one place: DeepSpeed's bf16 section (with longtrain's switches) and
// communication_data_type. What the run resolves from them is in config::RunPlan.
struct PrecisionConfig {
  bool bf16 = false;           // bf16.enabled: GEMMs in bf16 with fp32 outputs; weights, gradients, Adam fp32
  bool onlyIfFaster = true;    // bf16.only_if_faster (longtrain's): false runs bf16 even where it is slower
  bool attention = true;       // bf16.attention (longtrain's): the fused attention's tile products too (AVX512_BF16)
  bool gathers = true;         // bf16.gathers (longtrain's): ZeRO moves bf16 copies of GEMM-only weights
  CommDtype communication = CommDtype::Fp32;  // communication_data_type: ZeRO's gradient reduce-scatters
};

struct ZeroConfig {
  int stage = 0;
  int64_t subGroupSize = 1000000000, reduceBucketSize = 500000000, allgatherBucketSize = 500000000;
  bool overlapComm = true;
  int64_t prefetchBucketSize = 50000000, paramPersistenceThreshold = 100000, maxLiveParameters = 1000000000;
  OffloadConfig offloadOptimizer;
};

// One entry of DeepCompile's pass schedule: from `step` on, the program is the base rewritten
// by `passes` (the whole list; entries are not cumulative).
struct ScheduleEntry {
  int64_t step = 0;
  std::vector<std::string> passes;
};

struct CompileConfig {
  bool deepcompile = false;
  std::optional<std::vector<ScheduleEntry>> schedule;  // none: the default (DeepSpeed's for ZeRO-3)
};

struct DataConfig {
  DataType type = DataType::KvRecall;
  std::string path;
  // A SentencePiece model for the token file (its vocabulary is checked against the model's,
  // `generate` and train.sample_every decode with it, export copies it); "" : none, unless
  // model.init_from holds a tokenizer.model.
  std::string tokenizer;
  // "none": windows cut from the token stream as it is; "documents": the stream's EOS tokens
  // separate documents, and no token attends across a document boundary (positions restart).
  Packing packing = Packing::None;
  int64_t eosId = -1;  // the separator for "documents": data.eos_id, else the tokenizer's EOS
  int64_t seqLen = 256, numSamples = 100000, evalSamples = 64;
  double evalFraction = 0;  // token files: the last fraction of windows is held out for evaluation
  int64_t kvPairs = 16, kvQueries = 32, kvKeys = 32, kvValues = 16, kvNoise = 16;
  bool kvFused = false;
  bool tokenFile() const { return type != DataType::KvRecall; }
};

struct CheckpointConfig {
  std::string dir;         // root directory; checkpoints are <dir>/step-NNNNNNNN/
  int64_t everySteps = 0;  // 0: never (except on request)
  int64_t keepLast = 0;    // complete checkpoints kept; 0: all
  bool async = false;      // copy the state, write it on a background thread (ckpt::AsyncSaver)
  OnSaveError onError = OnSaveError::Stop;  // a failed save: stop every rank, or warn and train on
};

struct TrainSection {
  int64_t steps = 100;
  int nproc = 1;    // local ranks `longtrain train` launches when no launcher started it
  int threads = 0;  // intra-op threads per rank; 0 = the cores this rank owns
  int64_t evalEvery = 0;  // 0 = only at the end
  // Every sample_every steps rank 0 prints sample_tokens tokens generated after sample_prompt
  // (text, with data.tokenizer), after EOS for packed documents, else BOS. 0: never.
  int64_t sampleEvery = 0, sampleTokens = 32;
  std::string samplePrompt;
  // train.eval: at every evaluation (eval_every and the end) the loss by position over a token
  // file (what `longtrain eval --data` measures), on rank 0's copy of the weights; data "": none.
  struct LongEval {
    std::string data;
    TokenDtype dtype = TokenDtype::FromSidecar;
    Packing packing = Packing::None;
    int64_t seqLen = 0, windows = 4;
  } longEval;
  double commTimeoutS = 60;
  // MFU's denominator per rank (FLOP/s); 0: the best start-up GEMM measurement recorded for this
  // CPU and thread count (train/peak_record.h).
  double peakFlops = 0;
  // Per-rank memory budget (bytes) for activation_checkpointing "auto"; 0: 90% of what the
  // rank may use (MemAvailable and the cgroup limit, shared among the local ranks).
  int64_t memoryBudget = 0;
  // Refuse, before anything is allocated, a config whose predicted peak (longtrain plan's)
  // exceeds 1.2x what a rank may use; false skips the check.
  bool memoryPreflight = true;
  // Activation offload to disk: the kept inputs of recomputed blocks go to a file in this
  // directory after their forward and come back before their backward. "": kept in memory.
  std::string offloadDir;
  CheckpointConfig checkpoint;
  // train.comm_timeout_s in milliseconds: the bound on every collective and on waits for peers.
  int64_t commTimeoutMs() const { return static_cast<int64_t>(commTimeoutS * 1000); }
};

struct Config {
  // DeepSpeed keys; validate() derives whichever of the three was not given.
  int64_t trainBatchSize = 0, microBatch = 0, gradAccum = 0;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  double gradientClipping = 0;
  PrecisionConfig precision;
  ZeroConfig zero;
  CompileConfig compile;
  int sequenceParallelSize = 1;
  // sequence_parallel_ring_degree (0: chosen from the head counts) and sequence_parallel_balance
  // ("auto": zigzag when the ring degree > 1, "contiguous", "zigzag").
  int sequenceParallelRingDegree = 0;
  SpBalance sequenceParallelBalance = SpBalance::Auto;
  // sequence_parallel_ulysses_head_groups: the head groups Ulysses pipelines its all-to-alls
  // over (0: "auto"); ulyssesHeadGroups() (validate.h) resolves it.
  int sequenceParallelUlyssesHeadGroups = 0;
  // "auto": the memory model keeps as many blocks' graphs (no recompute) as fit
  // train.memory_budget; "all": every block is recomputed in backward; "none": none is.
  Recompute activationCheckpointing = Recompute::Auto;
  int64_t stepsPerPrint = 10;
  uint64_t seed = 1234;
  ModelConfig model;
  DataConfig data;
  TrainSection train;

  // Set by validate(): the world's split (SP x DP, Ulysses x ring).
  ParallelLayout layout;
  // The parsed JSON (after --set overrides, with init_from's model keys written in), for the record.
  std::string source;
  // Every key the parser read with the value it resolved to, defaults filled in (JSON):
  // `longtrain config CONFIG --print`.
  std::string effective;
  // Lines the run prints once at start: DeepSpeed "auto" values and no-op keys (config/deepspeed_keys.h).
  std::vector<std::string> notices;
};

}  // namespace lt::config
