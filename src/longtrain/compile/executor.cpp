// The interpreter of the step program. Memory: the kept block inputs (freed as backward
// passes them), the graphs of the blocks that keep theirs (ForwardGraph to Backward), and at
// most one block's recompute graph at a time.
#include "longtrain/compile/executor.h"

#include <ATen/ATen.h>

#include <chrono>

#include "longtrain/core/check.h"
#include "longtrain/core/trace.h"

namespace lt::compile {

Executor::Executor(const model::Model& m, model::AttentionFn attn, Hooks hooks)
    : model_(m), attn_(std::move(attn)), hooks_(std::move(hooks)) {}

MicroBatchStats Executor::run(const Program& p, const data::Batch& batch, const RunOptions& o) {
  LT_ASSERT(batch.shift_labels.defined(), "shift_labels must be formed before the step");
  const int L = model_.numBlocks();
  std::vector<at::Tensor> kept(L + 1);  // kept[b] = input of block b; kept[L] = final hidden
  std::vector<char> offloaded(L + 1, 0);
  // Blocks run by ForwardGraph: the input leaf (its grad is dL/dx_b) and the output with its graph.
  std::vector<at::Tensor> graphIn(L), graphOut(L);
  at::Tensor grad;                      // dLoss/d(current activation)
  MicroBatchStats st;
  auto keptBytes = [&](bool host) {
    int64_t n = 0;
    for (int b = 0; b <= L; ++b)
      if (kept[b].defined() && offloaded[b] == host) n += kept[b].nbytes();
    return n;
  };
  auto live = [&] { return keptBytes(false) + (hooks_.gatheredBytes ? hooks_.gatheredBytes() : 0); };
  if (o.profile) {
    o.profile->program = p;
    o.profile->instrs.assign(p.code.size(), {});
  }
  for (size_t pc = 0; pc < p.code.size(); ++pc) {
    const Instr& in = p.code[pc];
    trace::Scope ts("program", trace::enabled() ? p.listingOf(pc) : std::string());
    auto t0 = std::chrono::steady_clock::now();
    const int64_t gatheredBefore = hooks_.gatheredBytes ? hooks_.gatheredBytes() : 0;
    if (o.profile) o.profile->instrs[pc].liveBefore = live();
    switch (in.op) {
      case OpCode::Gather:
        if (hooks_.gather) hooks_.gather(in.group);
        break;
      case OpCode::Release:
        if (hooks_.release) hooks_.release(in.group);
        break;
      case OpCode::Embed: {
        at::NoGradGuard ng;
        kept[0] = model_.embed(batch.input_ids);
        break;
      }
      case OpCode::Forward: {
        at::NoGradGuard ng;
        kept[in.group + 1] = model_.block(in.group, kept[in.group], batch.position_ids, attn_);
        break;
      }
      case OpCode::LossAndGrad:
        grad = lossAndGrad(kept[L], batch.shift_labels, o.gradScale / o.lossDenominator, true, st);
        kept[L] = at::Tensor();
        break;
      case OpCode::ForwardGraph: {
        // The same ops on the same values as RecomputeBackward's recompute: bit-identical.
        graphIn[in.group] = kept[in.group].detach().requires_grad_(true);
        graphOut[in.group] = model_.block(in.group, graphIn[in.group], batch.position_ids, attn_);
        kept[in.group + 1] = graphOut[in.group].detach();
        break;
      }
      case OpCode::Backward: {
        LT_ASSERT(graphOut[in.group].defined(), "Backward(", in.group, ") without its ForwardGraph");
        graphOut[in.group].backward(grad);
        grad = graphIn[in.group].grad();
        graphIn[in.group] = graphOut[in.group] = at::Tensor();  // the graph goes with them
        break;
      }
      case OpCode::RecomputeBackward: {
        auto x = kept[in.group].detach().requires_grad_(true);
        auto y = model_.block(in.group, x, batch.position_ids, attn_);
        y.backward(grad);
        grad = x.grad();
        break;  // kept[b] lives on until FreeActivation(b) or the end of the micro-step
      }
      case OpCode::Prefetch:
        if (hooks_.prefetch) hooks_.prefetch(in.group);
        break;
      case OpCode::FreeActivation:
        kept[in.group] = at::Tensor();
        break;
      case OpCode::OffloadActivation:
        // The host is the device in this build: accounted, nothing copied. On an accelerator
        // this is kept[b].to(kCPU, non_blocking) into pinned memory.
        if (!kept[in.group].is_cpu()) kept[in.group] = kept[in.group].to(at::kCPU);
        offloaded[in.group] = 1;
        break;
      case OpCode::ReloadActivation:
        offloaded[in.group] = 0;
        break;
      case OpCode::EmbedBackward: {
        model_.embedBackward(batch.input_ids, grad);
        grad = at::Tensor();
        break;
      }
      case OpCode::ReduceGrads:
        if (hooks_.reduceGrads) hooks_.reduceGrads(in.group, o.boundary);
        break;
      case OpCode::OptimizerStep:
        if (o.boundary && hooks_.optimizerStep) hooks_.optimizerStep();
        break;
    }
    st.peakActivationBytes = std::max(st.peakActivationBytes, keptBytes(false));
    st.offloadedBytes = std::max(st.offloadedBytes, keptBytes(true));
    if (o.profile) {
      auto& ip = o.profile->instrs[pc];
      ip.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ip.liveAfter = live();
      if (in.op == OpCode::Gather || in.op == OpCode::Prefetch)
        ip.bytesMoved = std::max<int64_t>(0, (hooks_.gatheredBytes ? hooks_.gatheredBytes() : 0) - gatheredBefore);
      o.profile->peakLive = std::max({o.profile->peakLive, ip.liveBefore, ip.liveAfter});
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
    if (in.op == OpCode::Release && hooks_.release) hooks_.release(in.group);
    if (backwardHalf) continue;
    if (in.op == OpCode::Gather && hooks_.gather) hooks_.gather(in.group);
    else if (in.op == OpCode::Prefetch && hooks_.prefetch) hooks_.prefetch(in.group);
    else if (in.op == OpCode::Embed) x = model_.embed(batch.input_ids);
    else if (in.op == OpCode::Forward || in.op == OpCode::ForwardGraph)
      x = model_.block(in.group, x, batch.position_ids, attn_);
    else if (in.op == OpCode::LossAndGrad) {
      lossAndGrad(x, batch.shift_labels, 0, false, st);
      backwardHalf = true;
    }
  }
  return st;
}

at::Tensor Executor::lossAndGrad(const at::Tensor& h, const at::Tensor& shiftLabels, double scale, bool backward,
                                 MicroBatchStats& st) {
  const int64_t S = h.size(1), chunk = model_.config().lossChunk > 0 ? model_.config().lossChunk : S;
  at::Tensor gradH = backward && chunk < S ? at::empty_like(h) : at::Tensor();
  st.lossSum = 0;
  st.tokens = st.correct = 0;
  for (int64_t s0 = 0; s0 < S; s0 += chunk) {
    const int64_t s1 = std::min(S, s0 + chunk);
    auto hs = h.slice(1, s0, s1).detach();  // [B, tile, D]
    if (backward) hs.requires_grad_(true);
    auto ls = model::lossSum(model_.logits(hs), shiftLabels.slice(1, s0, s1));  // logits [B, tile, V]
    st.lossSum += ls.sum.item<double>();
    st.tokens += ls.count;
    st.correct += ls.correct;
    if (!backward) continue;
    (ls.sum * scale).backward();  // the head's parameter gradients accumulate tile by tile
    if (chunk >= S) return hs.grad();
    gradH.slice(1, s0, s1).copy_(hs.grad());
  }
  return gradH;
}

}  // namespace lt::compile
