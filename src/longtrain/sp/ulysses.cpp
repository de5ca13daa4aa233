// Ulysses adapter and attention. The all-to-all layout: a local [B, s, H, D] is viewed as
// [B, s, P, H/P, D] and permuted to [P, B, s, H/P, D] so chunk j (heads of rank j) is
// contiguous for alltoall_base; the receiver's chunk i is rank i's sequence shard.
#include "longtrain/sp/ulysses.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "longtrain/core/check.h"
#include "longtrain/sp/footprint.h"

namespace lt::sp {

// ---------------------------------------------------------------------------- all-to-all
namespace {

at::Tensor a2aSeqToHeads(const at::Tensor& x, comm::Comm* sp) {
  const int64_t P = sp->size(), B = x.size(0), s = x.size(1), H = x.size(2), D = x.size(3);
  auto send = x.reshape({B, s, P, H / P, D}).permute({2, 0, 1, 3, 4}).contiguous();  // [P, B, s, H/P, D]
  auto recv = at::empty_like(send);
  sp->allToAll(recv, send).wait();
  return recv.permute({1, 0, 2, 3, 4}).reshape({B, P * s, H / P, D});  // [B, S, H/P, D]
}

at::Tensor a2aHeadsToSeq(const at::Tensor& x, comm::Comm* sp) {
  const int64_t P = sp->size(), B = x.size(0), S = x.size(1), h = x.size(2), D = x.size(3), s = S / P;
  auto send = x.reshape({B, P, s, h, D}).permute({1, 0, 2, 3, 4}).contiguous();  // [P, B, s, H/P, D]
  auto recv = at::empty_like(send);
  sp->allToAll(recv, send).wait();
  return recv.permute({1, 2, 0, 3, 4}).reshape({B, s, P * h, D});  // [B, s, H, D]
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

comm::Comm* commOf(AutogradContext* ctx) {
  return reinterpret_cast<comm::Comm*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

struct SeqToHeadsFn : torch::autograd::Function<SeqToHeadsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t commPtr) {
    ctx->saved_data["comm"] = commPtr;
    return a2aSeqToHeads(x, reinterpret_cast<comm::Comm*>(static_cast<intptr_t>(commPtr)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {a2aHeadsToSeq(g[0].contiguous(), commOf(ctx)), at::Tensor()};
  }
};

struct HeadsToSeqFn : torch::autograd::Function<HeadsToSeqFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t commPtr) {
    ctx->saved_data["comm"] = commPtr;
    return a2aHeadsToSeq(x, reinterpret_cast<comm::Comm*>(static_cast<intptr_t>(commPtr)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {a2aSeqToHeads(g[0].contiguous(), commOf(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor seqToHeads(const at::Tensor& x, comm::Comm* sp) {
  return SeqToHeadsFn::apply(x, static_cast<int64_t>(reinterpret_cast<intptr_t>(sp)));
}
at::Tensor headsToSeq(const at::Tensor& x, comm::Comm* sp) {
  return HeadsToSeqFn::apply(x, static_cast<int64_t>(reinterpret_cast<intptr_t>(sp)));
}

// The position ids [B, S] of the whole sequence from every SP rank's shard [B, S/P] (rank r
// holds tokens [r S/P, (r+1) S/P)): packed documents may cross shard boundaries.
static at::Tensor wholeSequence(const at::Tensor& posShard, comm::Comm* sp) {
  const int64_t P = sp->size(), B = posShard.size(0), n = posShard.size(1);
  auto all = at::empty({P * B * n}, at::kLong);
  sp->allGather(all, posShard.contiguous().view({-1})).wait();
  return all.view({P, B, n}).permute({1, 0, 2}).reshape({B, P * n});
}

model::AttentionFn ulyssesAttention(std::shared_ptr<comm::Comm> sp, model::AttentionFn core) {
  return [sp, core](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos) {
    const int64_t P = sp->size(), kv = k.size(2);
    at::Tensor kk = k, vv = v;
    if (kv < P) {  // replicate KV heads so every rank holds one (autograd sums the copies' grads)
      kk = k.repeat_interleave(P / kv, 2);
      vv = v.repeat_interleave(P / kv, 2);
    }
    auto qh = seqToHeads(q, sp.get());   // [B, S, H/P, Dh]
    auto kh = seqToHeads(kk, sp.get());  // [B, S, KV/P (>= 1), Dh]
    auto vh = seqToHeads(vv, sp.get());
    auto o = core(qh, kh, vh, pos.defined() ? wholeSequence(pos, sp.get()) : at::Tensor());  // [B, S, H/P, Dh]
    return headsToSeq(o.contiguous(), sp.get());  // [B, S/P, H, Dh]
  };
}

// ---------------------------------------------------------------------------- adapter
UlyssesLoader::UlyssesLoader(std::unique_ptr<BatchSource> src, std::shared_ptr<comm::Comm> sp,
                             const ParallelLayout& layout)
    : src_(std::move(src)), sp_(std::move(sp)), layout_(layout) {
  LT_ASSERT(layout.P == sp_->size());
}

data::Batch UlyssesLoader::next() {
  if (fifo_.empty()) refill(src_->next());
  return fifo_.pop();
}

void UlyssesLoader::refill(const data::Batch& mine) {
  const int P = sp_->size();
  // 1. Shapes of every rank's fields, so every rank validates every batch the same way.
  //    Per rank: B, len(input_ids), len(labels), len(position_ids) (-1 = missing).
  auto len = [](const at::Tensor& t) { return t.defined() ? static_cast<float>(t.size(1)) : -1.0f; };
  auto shape = at::tensor({static_cast<float>(mine.input_ids.size(0)), len(mine.input_ids), len(mine.labels),
                           len(mine.position_ids)});
  auto shapes = at::empty({P, 4});
  sp_->allGather(shapes, shape).wait();
  auto sh = shapes.accessor<float, 2>();
  const int64_t B = static_cast<int64_t>(sh[0][0]);
  int64_t maxLen = 0;
  for (int r = 0; r < P; ++r) {
    const int64_t S = static_cast<int64_t>(sh[r][1]);
    LT_CHECK(static_cast<int64_t>(sh[r][0]) == B, "SP rank ", r, "'s batch has ", sh[r][0],
             " samples but SP rank 0's has ", B, "; every SP rank's loader must yield the same batch size");
    LT_CHECK(sh[r][2] >= 0, "SP rank ", r, "'s batch has no 'labels'; Ulysses needs labels to form shift_labels");
    LT_CHECK(sh[r][3] >= 0, "SP rank ", r, "'s batch has no 'position_ids'; Ulysses needs them (shards keep ",
             "their global positions)");
    LT_CHECK(sh[r][2] == S && sh[r][3] == S, "SP rank ", r, "'s batch: 'labels' (", sh[r][2], ") or 'position_ids' (",
             sh[r][3], ") length differs from 'input_ids' (", S, ")");
    maxLen = std::max(maxLen, S);
  }
  // 2. The fields themselves, padded to the longest rank's length.
  auto gather = [&](const at::Tensor& t) {
    auto padded = at::full({B, maxLen}, data::kIgnoreIndex, t.options());
    padded.slice(1, 0, t.size(1)).copy_(t);
    auto all = at::empty({P, B, maxLen}, t.options());
    sp_->allGather(all, padded).wait();
    return all;
  };
  auto ids = gather(mine.input_ids), labels = gather(mine.labels), pos = gather(mine.position_ids);
  // 3. For each rank's batch (rank 0's first): shift labels on the whole sequence, take my shard.
  for (int r = 0; r < P; ++r) {
    const int64_t S = static_cast<int64_t>(sh[r][1]);
    data::Batch whole;
    whole.input_ids = ids[r].slice(1, 0, S);
    whole.labels = labels[r].slice(1, 0, S);
    whole.position_ids = pos[r].slice(1, 0, S);
    fifo_.push(shardBatch(whole, sp_->rank(), layout_));
  }
}

// The all-to-alls' backward: the gradient made contiguous, its send and receive buffers (each
// [B, S/P, H x Dh] bytes on a rank).
Footprint ulyssesFootprint(const StepShape& s) {
  Footprint f;
  f.work.add(3, s.rows(s.heads * s.headDim));
  return f;
}

}  // namespace lt::sp
