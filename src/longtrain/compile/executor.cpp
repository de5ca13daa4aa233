// The interpreter of the step program. Memory: at most one block's recompute graph is alive
// at a time, plus the kept block inputs (freed as backward passes them).
#include "longtrain/compile/executor.h"

#include <ATen/ATen.h>

#include "longtrain/core/check.h"

namespace lt::compile {

Executor::Executor(const model::Model& m, model::AttentionFn attn, Hooks hooks)
    : model_(m), attn_(std::move(attn)), hooks_(std::move(hooks)) {}

MicroBatchStats Executor::run(const Program& p, const data::Batch& batch, const RunOptions& o) {
  LT_ASSERT(batch.shift_labels.defined(), "shift_labels must be formed before the step");
  const int L = model_.numBlocks();
  std::vector<at::Tensor> kept(L + 1);  // kept[b] = input of block b; kept[L] = final hidden
  at::Tensor grad;                      // dLoss/d(current activation)
  MicroBatchStats st;
  for (const Instr& in : p.code) {
    switch (in.op) {
      case OpCode::OpGather:
        if (hooks_.gather) hooks_.gather(in.group);
        break;
      case OpCode::OpRelease:
        if (hooks_.release) hooks_.release(in.group);
        break;
      case OpCode::OpEmbed: {
        at::NoGradGuard ng;
        kept[0] = model_.embed(batch.input_ids);
        break;
      }
      case OpCode::OpForward: {
        at::NoGradGuard ng;
        kept[in.group + 1] = model_.block(in.group, kept[in.group], batch.position_ids, attn_);
        break;
      }
      case OpCode::OpLossAndGrad: {
        auto h = kept[L].detach().requires_grad_(true);
        auto ls = model::lossSum(model_.logits(h), batch.shift_labels);
        st.lossSum = ls.sum.item<double>();
        st.tokens = ls.count;
        st.correct = ls.correct;
        (ls.sum * (o.gradScale / o.lossDenominator)).backward();
        grad = h.grad();
        kept[L] = at::Tensor();
        break;
      }
      case OpCode::OpRecomputeBackward: {
        auto x = kept[in.group].detach().requires_grad_(true);
        auto y = model_.block(in.group, x, batch.position_ids, attn_);
        y.backward(grad);
        grad = x.grad();
        kept[in.group] = at::Tensor();  // EmbedBackward re-makes x0 itself
        break;
      }
      case OpCode::OpEmbedBackward: {
        model_.embedBackward(batch.input_ids, grad);
        grad = at::Tensor();
        kept[0] = at::Tensor();
        break;
      }
      case OpCode::OpReduceGrads:
        if (hooks_.reduceGrads) hooks_.reduceGrads(in.group, o.boundary);
        break;
      case OpCode::OpOptimizerStep:
        if (o.boundary && hooks_.optimizerStep) hooks_.optimizerStep();
        break;
    }
  }
  return st;
}

MicroBatchStats Executor::evaluate(const Program& p, const data::Batch& batch) {
  at::NoGradGuard ng;
  at::Tensor x;
  MicroBatchStats st;
  bool backwardHalf = false;  // after the loss only Release runs (to free what the loss used)
  for (const Instr& in : p.code) {
    if (in.op == OpCode::OpRelease && hooks_.release) hooks_.release(in.group);
    if (backwardHalf) continue;
    if (in.op == OpCode::OpGather && hooks_.gather) hooks_.gather(in.group);
    else if (in.op == OpCode::OpEmbed) x = model_.embed(batch.input_ids);
    else if (in.op == OpCode::OpForward) x = model_.block(in.group, x, batch.position_ids, attn_);
    else if (in.op == OpCode::OpLossAndGrad) {
      auto ls = model::lossSum(model_.logits(x), batch.shift_labels);
      st.lossSum = ls.sum.item<double>();
      st.tokens = ls.count;
      st.correct = ls.correct;
      backwardHalf = true;
    }
  }
  return st;
}

}  // namespace lt::compile
