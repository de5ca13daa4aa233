// Runs a Program on one micro-batch. The executor owns the activation bookkeeping (kept
// block inputs, the running upstream gradient); everything distributed is a hook the engine
// supplies, so the same executor serves DP, SP and ZeRO. The loss is scaled before
// backward by `gradScale / lossDenominator` so gradients come out already normalized.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>

#include "longtrain/compile/activation_offload.h"
#include "longtrain/compile/passes.h"
#include "longtrain/compile/program.h"
#include "longtrain/data/data.h"
#include "longtrain/model/model.h"

namespace lt::compile {

struct Hooks {
  std::function<void(int group)> gather, release;  // may be empty (no ZeRO-3)
  std::function<void(int group)> prefetch;         // async gather; may be empty
  std::function<int64_t()> gatheredBytes;          // live gathered parameter bytes (profiling)
  // Called after every micro-batch's backward of group g; `boundary` marks the last
  // micro-batch of the optimizer step. May be empty (single rank without ZeRO).
  std::function<void(int group, bool boundary)> reduceGrads;
};

struct MicroBatchStats {
  // Kept block inputs in memory, at their peak (with offload: also those still being written
  // and those read back ahead of their backward).
  int64_t peakActivationBytes = 0;
  int64_t offloadedBytes = 0;  // kept block inputs offloaded (in the file with offload), at their peak
  double lossSum = 0;   // this rank's sum of token losses
  int64_t tokens = 0;   // this rank's scored tokens
  int64_t correct = 0;  // this rank's argmax hits among them
};

struct RunOptions {
  double lossDenominator = 1;  // scored tokens over the SP group (the loss is sum/denominator)
  double gradScale = 1;        // 1 / gradient_accumulation_steps
  bool boundary = true;        // the optimizer step's last micro-batch (the engine then steps)
  Profile* profile = nullptr;  // when set, per-instruction times and live bytes are recorded
};

class Executor {
 public:
  // `offload`: where OffloadActivation writes kept inputs (train.offload_dir); null: the
  // instructions only account (the tensors stay in memory). Not owned.
  Executor(model::Model& m, model::AttentionFn attn, Hooks hooks, ActivationOffload* offload = nullptr);
  MicroBatchStats run(const Program& p, const data::Batch& batch, const RunOptions& o);
  // Forward only (for evaluation): runs the forward part of the program under no-grad.
  MicroBatchStats evaluate(const Program& p, const data::Batch& batch);

 private:
  struct RunState;
  void execute(const Instr& in, RunState& r);
  // The loss of head(h) in sequence tiles of the model's loss_chunk tokens (0: one tile), so the
  // [B, S, vocab] logits never exist whole (DeepSpeed's TiledFusedLogitsLoss): its sums into
  // `st`, and with lossAndGrad dLoss/dh, the loss scaled by `scale` before backward.
  int64_t lossTile(int64_t S) const;
  void loss(const at::Tensor& h, const at::Tensor& shiftLabels, MicroBatchStats& st);
  at::Tensor lossAndGrad(const at::Tensor& h, const at::Tensor& shiftLabels, double scale, MicroBatchStats& st);

  model::Model& model_;  // its gradients and kept buffers are written
  model::AttentionFn attn_;
  Hooks hooks_;
  ActivationOffload* offload_;
};

}  // namespace lt::compile
