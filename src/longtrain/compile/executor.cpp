// The interpreter of the step program. Memory: the kept block inputs (freed as backward
// passes them, or written to disk after their forward and read back ahead of their backward),
// the graphs of the blocks that keep theirs (ForwardGraph to Backward), and at
// most one block's recompute graph at a time.
#include "longtrain/compile/executor.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>

#include "longtrain/compile/footprint.h"
#include "longtrain/core/check.h"
#include "longtrain/core/trace.h"

namespace lt::compile {

namespace {

// y.backward(dy) without holding y: a block's output [B, S, D] is freed before its backward
// runs (the block's last op, a residual add, does not need it). y.backward would keep it.
void backwardReleasing(at::Tensor&& y, const at::Tensor& dy) {
  const torch::autograd::Edge root = torch::autograd::impl::gradient_edge(y);
  y = at::Tensor();
  torch::autograd::Engine::get_default_engine().execute({root}, {dy}, /*keep_graph=*/false, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true);
}

}  // namespace

Executor::Executor(model::Model& m, model::AttentionFn attn, Hooks hooks, ActivationOffload* offload)
    : model_(m), attn_(std::move(attn)), hooks_(std::move(hooks)), offload_(offload) {}

// One micro-batch's activations while the program runs.
struct Executor::RunState {
  RunState(const data::Batch& b, const RunOptions& o, int L, const ActivationOffload* off)
      : batch(b), opts(o), file(off), kept(L + 1), offloaded(L + 1, 0), graphIn(L), graphOut(L) {}
  const data::Batch& batch;
  const RunOptions& opts;
  const ActivationOffload* file;  // train.offload_dir's, or null
  std::vector<at::Tensor> kept;  // kept[b] = input of block b; kept[L] = final hidden
  std::vector<char> offloaded;   // kept[b] accounted as moved to host memory
  // Blocks run by ForwardGraph: the input leaf (its grad is dL/dx_b) and the output with its graph.
  std::vector<at::Tensor> graphIn, graphOut;
  at::Tensor grad;  // dLoss/d(current activation)
  MicroBatchStats st;

  int64_t keptBytes(bool host) const {
    int64_t n = 0;
    for (size_t b = 0; b < kept.size(); ++b)
      if (kept[b].defined() && offloaded[b] == host) n += kept[b].nbytes();
    if (file) n += host ? file->offloadedBytes() : file->residentBytes();
    return n;
  }
};

MicroBatchStats Executor::run(const Program& p, const data::Batch& batch, const RunOptions& o) {
  LT_ASSERT(batch.shift_labels.defined(), "shift_labels must be formed before the step");
  RunState r(batch, o, model_.numBlocks(), offload_);
  if (offload_) offload_->reset();
  auto live = [&] { return r.keptBytes(false) + (hooks_.gatheredBytes ? hooks_.gatheredBytes() : 0); };
  if (o.profile) {
    o.profile->program = p;
    o.profile->instrs.assign(p.code.size(), {});
  }
  for (size_t pc = 0; pc < p.code.size(); ++pc) {
    trace::Scope ts("program", trace::enabled() ? p.listingOf(pc) : std::string());
    auto t0 = std::chrono::steady_clock::now();
    if (o.profile) o.profile->instrs[pc].liveBefore = live();
    execute(p.code[pc], r);
    r.st.peakActivationBytes = std::max(r.st.peakActivationBytes, r.keptBytes(false));
    r.st.offloadedBytes = std::max(r.st.offloadedBytes, r.keptBytes(true));
    if (!o.profile) continue;
    auto& ip = o.profile->instrs[pc];
    ip.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ip.liveAfter = live();
    o.profile->peakLive = std::max({o.profile->peakLive, ip.liveBefore, ip.liveAfter});
  }
  return r.st;
}

void Executor::execute(const Instr& in, RunState& r) {
  const int b = in.group;
  switch (in.op) {
    case OpCode::Gather:
      if (hooks_.gather) hooks_.gather(b);
      break;
    case OpCode::Release:
      if (hooks_.release) hooks_.release(b);
      break;
    case OpCode::Prefetch:
      if (hooks_.prefetch) hooks_.prefetch(b);
      break;
    case OpCode::Embed: {
      at::NoGradGuard ng;
      r.kept[0] = model_.embed(r.batch.input_ids);
      break;
    }
    case OpCode::Forward: {
      at::NoGradGuard ng;
      r.kept[b + 1] = model_.block(b, r.kept[b], r.batch.position_ids, attn_);
      break;
    }
    case OpCode::ForwardGraph:
      // The same ops on the same values as RecomputeBackward's recompute: bit-identical.
      r.graphIn[b] = r.kept[b].detach().requires_grad_(true);
      r.graphOut[b] = model_.block(b, r.graphIn[b], r.batch.position_ids, attn_);
      r.kept[b + 1] = r.graphOut[b].detach();
      break;
    case OpCode::LossAndGrad: {
      const int L = model_.numBlocks();
      r.grad = lossAndGrad(r.kept[L], r.batch.shift_labels, r.opts.gradScale / r.opts.lossDenominator, r.st);
      r.kept[L] = at::Tensor();
      break;
    }
    case OpCode::Backward:
      LT_ASSERT(r.graphOut[b].defined(), "Backward(", b, ") without its ForwardGraph");
      backwardReleasing(std::move(r.graphOut[b]), r.grad);  // the graph goes with it
      r.grad = r.graphIn[b].grad();
      r.graphIn[b] = r.graphOut[b] = at::Tensor();
      break;
    case OpCode::RecomputeBackward: {
      if (offload_ && offload_->holds(b)) r.kept[b] = offload_->take(b);
      auto x = r.kept[b].detach().requires_grad_(true);
      backwardReleasing(model_.block(b, x, r.batch.position_ids, attn_), r.grad);
      r.grad = x.grad();
      break;  // kept[b] lives on until FreeActivation(b) or the end of the micro-step
    }
    case OpCode::FreeActivation:
      r.kept[b] = at::Tensor();
      break;
    case OpCode::OffloadActivation:
      if (offload_) {  // to the file, asynchronously; the tensor is released once written
        offload_->offload(b, r.kept[b]);
        r.kept[b] = at::Tensor();
        break;
      }
      // No file: accounted only. (On an accelerator this is where kept[b] would go to pinned
      // host memory, non_blocking.)
      if (!r.kept[b].is_cpu()) r.kept[b] = r.kept[b].to(at::kCPU);
      r.offloaded[b] = 1;
      break;
    case OpCode::ReloadActivation:
      if (offload_) offload_->prefetch(b);  // RecomputeBackward waits for it
      else r.offloaded[b] = 0;
      break;
    case OpCode::EmbedBackward:
      model_.embedBackward(r.batch.input_ids, r.grad);
      r.grad = at::Tensor();
      break;
    case OpCode::ReduceGrads:
      if (hooks_.reduceGrads) hooks_.reduceGrads(b, r.opts.boundary);
      break;
    case OpCode::OptimizerStep:  // the boundary marker: the engine steps after run() returns
      break;
  }
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
      loss(x, batch.shift_labels, st);
      backwardHalf = true;
    }
  }
  return st;
}

int64_t Executor::lossTile(int64_t S) const {
  return model_.config().lossChunk > 0 ? std::min(model_.config().lossChunk, S) : S;
}

namespace {
void addLoss(double sum, int64_t count, int64_t correct, MicroBatchStats& st) {
  st.lossSum += sum;
  st.tokens += count;
  st.correct += correct;
}
void addLoss(const model::LossSum& ls, MicroBatchStats& st) { addLoss(ls.sum.item<double>(), ls.count, ls.correct, st); }
void addLoss(const model::Model::TileLoss& tl, MicroBatchStats& st) { addLoss(tl.sum, tl.count, tl.correct, st); }
}  // namespace

void Executor::loss(const at::Tensor& h, const at::Tensor& shiftLabels, MicroBatchStats& st) {
  const int64_t S = h.size(1), tile = lossTile(S);
  for (int64_t s0 = 0; s0 < S; s0 += tile) {
    const int64_t s1 = std::min(S, s0 + tile);
    if (model_.config().fusedKernels) addLoss(model_.headLoss(h.slice(1, s0, s1), shiftLabels.slice(1, s0, s1), 0), st);
    else addLoss(model::lossSum(model_.logits(h.slice(1, s0, s1)), shiftLabels.slice(1, s0, s1)), st);
  }
}

at::Tensor Executor::lossAndGrad(const at::Tensor& h, const at::Tensor& shiftLabels, double scale,
                                 MicroBatchStats& st) {
  const int64_t S = h.size(1), tile = lossTile(S);
  at::Tensor gradH = tile < S ? at::empty_like(h) : at::Tensor();
  for (int64_t s0 = 0; s0 < S; s0 += tile) {
    const int64_t s1 = std::min(S, s0 + tile);
    if (model_.config().fusedKernels) {  // the LM head fused with the loss: one [B x tile, V] buffer
      LT_ASSERT(scale != 0, "lossAndGrad: a zero loss scale");
      auto tl = model_.headLoss(h.slice(1, s0, s1), shiftLabels.slice(1, s0, s1), scale);
      addLoss(tl, st);
      if (tile == S) return tl.gradH;
      gradH.slice(1, s0, s1).copy_(tl.gradH);
      continue;
    }
    auto hs = h.slice(1, s0, s1).detach().requires_grad_(true);  // [B, tile, D]
    auto ls = model::lossSum(model_.logits(hs), shiftLabels.slice(1, s0, s1));  // logits [B, tile, V]
    addLoss(ls, st);
    (ls.sum * scale).backward();  // the head's parameter gradients accumulate tile by tile
    if (tile == S) return hs.grad();
    gradH.slice(1, s0, s1).copy_(hs.grad());
  }
  return gradH;
}

// Footprints (footprint.h). The batch: ids, labels, positions, shift_labels as int64 (the
// Ulysses loader all-gathers the P batches and queues P shards: the same total), plus
// kv_recall's samples as vectors while collating.
double batchBytes(const StepShape& s) { return 48 * s.batch * s.seq; }

// RecomputeBackward and Backward: the upstream gradient r.grad (backwardReleasing has dropped
// the block's output); LossAndGrad in tiles: the gradient of its input, assembled tile by tile.
TensorBytes executorWork(OpCode op, const StepShape& s) {
  TensorBytes t;
  if (op == OpCode::RecomputeBackward || op == OpCode::Backward) t.add(1, s.rows(s.hidden));
  if (op == OpCode::LossAndGrad && s.lossTile < s.tokens) t.add(1, s.rows(s.hidden));
  return t;
}

}  // namespace lt::compile
