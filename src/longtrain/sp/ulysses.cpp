// Ulysses adapter and attention. The all-to-all layout: a local [B, s, H, D] is viewed as
// [B, s, P, H/P, D] and permuted to [P, B, s, H/P, D] so chunk j (heads of rank j) is
// contiguous for alltoall_base; the receiver's chunk i is rank i's sequence shard. The pipelined
// path views it as [B, s, P, G, n, D] (n heads per group) and sends one group's slice, with q,
// k and v side by side along the head axis: one all-to-all per group, not three.
#include "longtrain/sp/ulysses.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <utility>
#include <vector>

#include "longtrain/core/check.h"
#include "longtrain/kernels/footprint.h"
#include "longtrain/model/attention.h"
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

// ---------------------------------------------------------------------------- pipelined
namespace {

// A rank's heads after the all-to-all cut into G groups: per group hq query heads and hkv kv
// heads. A [B, s, P G n, D] tensor in sequence layout is viewed as [B, s, P, G, n, D].
struct HeadGroups {
  int64_t P, G, B, s, D, hq, hkv;
  int64_t width() const { return hq + 2 * hkv; }  // q, k, v of one group side by side
  // Group g of x [B, s, P G n, D] for every destination: [P, B, s, n, D] (a view).
  at::Tensor toSend(const at::Tensor& x, int64_t g, int64_t n) const {
    return x.view({B, s, P, G, n, D}).select(3, g).permute({2, 0, 1, 3, 4});
  }
  // Where group g received from every rank ([P, B, s, n, D], chunk j from rank j) lands in x.
  void land(at::Tensor& x, int64_t g, const at::Tensor& recv) const {
    const int64_t n = recv.size(3);
    x.view({B, s, P, G, n, D}).select(3, g).copy_(recv.permute({1, 2, 0, 3, 4}));
  }
  // A group's heads over the whole sequence [B, P s, n, D] cut into the P shards: [P, B, s, n, D].
  at::Tensor byShard(const at::Tensor& y) const {
    return y.view({B, P, s, y.size(2), D}).permute({1, 0, 2, 3, 4});
  }
  // The inverse of byShard, contiguous: the kernel's layout.
  at::Tensor asKernelInput(const at::Tensor& recv) const {
    return recv.permute({1, 0, 2, 3, 4}).reshape({B, P * s, recv.size(3), D}).contiguous();
  }
  // A received [P, B, s, hq + 2 hkv, D] of q, k, v side by side as the kernel's q, k, v.
  std::array<at::Tensor, 3> unpacked(const at::Tensor& recv) const {
    return {asKernelInput(recv.narrow(3, 0, hq)), asKernelInput(recv.narrow(3, hq, hkv)),
            asKernelInput(recv.narrow(3, hq + hkv, hkv))};
  }
};

HeadGroups headGroupsOf(const at::Tensor& q, const at::Tensor& k, int64_t P, int64_t G) {
  const int64_t localKv = k.size(2) / P;
  LT_CHECK(G >= 1 && localKv % G == 0, "Ulysses: ", G, " head groups do not divide the ", localKv,
           " kv heads each rank holds; set sequence_parallel_ulysses_head_groups to a divisor of ", localKv);
  return {P, G, q.size(0), q.size(1), q.size(3), q.size(2) / P / G, localKv / G};
}

// One all-to-all in flight with the buffers it reads and writes.
struct InFlight {
  at::Tensor send, recv;
  comm::Work work;
  at::Tensor take() {  // the received buffer, released here
    work.wait();
    send.reset();
    return std::move(recv);
  }
};

InFlight exchange(comm::Comm* sp, at::Tensor send) {
  InFlight f{std::move(send), {}, {}};
  f.recv = at::empty_like(f.send);
  f.work = sp->allToAll(f.recv, f.send);
  return f;
}

// [P, B, s, hq + 2 hkv, D]: q, k, v (one group, for every rank) side by side.
at::Tensor packed(const HeadGroups& h, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  auto out = at::empty({h.P, h.B, h.s, h.width(), h.D}, q.options());
  out.narrow(3, 0, h.hq).copy_(q);
  out.narrow(3, h.hq, h.hkv).copy_(k);
  out.narrow(3, h.hq + h.hkv, h.hkv).copy_(v);
  return out;
}

// q [B, s, H, D], k and v [B, s, KV, D] (KV >= P) -> [B, s, H, D]; saves per group what
// FusedAttentionFn saves (q, k, v, out, lse), so the saved bytes are the unpipelined kernel's.
struct PipelinedUlyssesFn : torch::autograd::Function<PipelinedUlyssesFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qIn, const at::Tensor& kIn,
                            const at::Tensor& vIn, const at::Tensor& start, int64_t commPtr, int64_t groups,
                            int64_t tile, int64_t isa, bool bf16) {
    at::NoGradGuard ng;
    ctx->saved_data["comm"] = commPtr;
    ctx->saved_data["groups"] = groups;
    kernels::saveOptions(ctx, start, tile, static_cast<kernels::Isa>(isa), bf16);
    comm::Comm* sp = commOf(ctx);
    const auto q = qIn.contiguous(), k = kIn.contiguous(), v = vIn.contiguous();
    const HeadGroups h = headGroupsOf(q, k, sp->size(), groups);
    const auto options = kernels::savedOptions(ctx);
    auto send = [&](int64_t g) {
      return exchange(sp, packed(h, h.toSend(q, g, h.hq), h.toSend(k, g, h.hkv), h.toSend(v, g, h.hkv)));
    };
    auto out = at::empty_like(q);
    std::vector<at::Tensor> saved;
    InFlight next = send(0), back;
    for (int64_t g = 0; g < h.G; ++g) {
      InFlight mine = std::move(next);
      if (g + 1 < h.G) next = send(g + 1);
      const auto [qg, kg, vg] = h.unpacked(mine.take());
      auto r = kernels::fusedAttentionForward(qg, kg, vg, options);
      if (g > 0) h.land(out, g - 1, back.take());  // it had group g's kernel time to arrive
      back = exchange(sp, h.byShard(r.out).contiguous());
      saved.insert(saved.end(), {qg, kg, vg, r.out, r.lse});
    }
    h.land(out, h.G - 1, back.take());
    ctx->save_for_backward(saved);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::NoGradGuard ng;
    comm::Comm* sp = commOf(ctx);
    const auto saved = ctx->get_saved_variables();
    const auto dout = grads[0].contiguous();  // [B, s, H, D]
    const int64_t G = ctx->saved_data["groups"].toInt(), P = sp->size();
    const HeadGroups h{P, G, dout.size(0), dout.size(1), dout.size(3), saved[0].size(2), saved[1].size(2)};
    const auto options = kernels::savedOptions(ctx);
    auto dq = at::empty_like(dout), dk = at::empty({h.B, h.s, P * G * h.hkv, h.D}, dout.options());
    auto dv = at::empty_like(dk);
    auto landGrads = [&](int64_t g, const at::Tensor& recv) {
      h.land(dq, g, recv.narrow(3, 0, h.hq));
      h.land(dk, g, recv.narrow(3, h.hq, h.hkv));
      h.land(dv, g, recv.narrow(3, h.hq + h.hkv, h.hkv));
    };
    auto send = [&](int64_t g) { return exchange(sp, h.toSend(dout, g, h.hq).contiguous()); };
    InFlight next = send(0), back;
    for (int64_t g = 0; g < G; ++g) {
      InFlight mine = std::move(next);
      if (g + 1 < G) next = send(g + 1);
      const auto dog = h.asKernelInput(mine.take());
      const auto* s = &saved[5 * g];
      auto d = kernels::fusedAttentionBackward(s[0], s[1], s[2], {s[3], s[4]}, dog, options);
      if (g > 0) landGrads(g - 1, back.take());
      back = exchange(sp, packed(h, h.byShard(d.dq), h.byShard(d.dk), h.byShard(d.dv)));
    }
    landGrads(G - 1, back.take());
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Replicates KV heads so every rank holds one (autograd sums the copies' grads).
std::pair<at::Tensor, at::Tensor> kvForRanks(const at::Tensor& k, const at::Tensor& v, int64_t P) {
  if (k.size(2) >= P) return {k, v};
  return {k.repeat_interleave(P / k.size(2), 2), v.repeat_interleave(P / k.size(2), 2)};
}

model::AttentionFn unpipelined(std::shared_ptr<comm::Comm> sp, model::AttentionFn core) {
  return [sp, core](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos) {
    const auto [kk, vv] = kvForRanks(k, v, sp->size());
    auto qh = seqToHeads(q, sp.get());   // [B, S, H/P, Dh]
    auto kh = seqToHeads(kk, sp.get());  // [B, S, KV/P (>= 1), Dh]
    auto vh = seqToHeads(vv, sp.get());
    auto o = core(qh, kh, vh, pos.defined() ? wholeSequence(pos, sp.get()) : at::Tensor());  // [B, S, H/P, Dh]
    return headsToSeq(o.contiguous(), sp.get());  // [B, S/P, H, Dh]
  };
}

model::AttentionFn pipelined(std::shared_ptr<comm::Comm> sp, const UlyssesPipeline& pipe) {
  return [sp, pipe](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos) {
    const auto [kk, vv] = kvForRanks(k, v, sp->size());
    const auto whole = pos.defined() ? wholeSequence(pos, sp.get()) : at::Tensor();
    // The fused core's mask (model::attentionCore) over the whole sequence; none: an empty tensor.
    auto start = model::firstVisibleKey(whole, q.size(0), q.size(1) * sp->size(), pipe.window);
    if (!start.defined()) start = at::empty({0}, at::kLong);
    const auto& o = *pipe.fused;
    return PipelinedUlyssesFn::apply(q, kk, vv, start.contiguous(),
                                     static_cast<int64_t>(reinterpret_cast<intptr_t>(sp.get())), pipe.headGroups,
                                     o.tile, static_cast<int64_t>(o.isa), o.bf16);
  };
}

}  // namespace

model::AttentionFn ulyssesAttention(std::shared_ptr<comm::Comm> sp, model::AttentionFn core,
                                    const UlyssesPipeline& pipeline) {
  if (pipeline.headGroups > 1 && pipeline.fused) return pipelined(std::move(sp), pipeline);
  return unpipelined(std::move(sp), std::move(core));
}

UlyssesPipeline ulyssesPipeline(const model::ModelConfig& m, int headGroups) {
  UlyssesPipeline p;
  p.headGroups = headGroups;
  if (m.attention == config::AttentionKernel::Fused) p.fused = model::fusedAttentionOptions(m);
  p.window = m.slidingWindow;
  return p;
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

// PipelinedUlyssesFn: per group what the fused kernel saves (in all, its saved bytes at G = 1).
// While group g's kernel backward runs: the incoming gradient (contiguous) and the dq, dk, dv
// being assembled, whole; group g+1's gradient in flight (send, receive) and group g's in the
// kernel's layout; group g-1's dq/dk/dv in flight (send, receive); the kernel's work on group g.
// At G = 2 groups g+1 and g-1 are never both in flight, so this is an upper bound there:
// measured (bench/heap_by_instruction.py, e2e_long at seq 16384 on SP 2, Q = 4 MiB, KV = 2 MiB)
// 29.9 MiB held at the peak of the attention's backward, incoming gradient included; 32 declared.
Footprint ulyssesPipelineFootprint(const StepShape& s, int groups) {
  StepShape one = s;  // one head group; G divides the kv heads a rank holds (config::ulyssesHeadGroups)
  one.heads /= groups;
  one.kvHeads /= groups;
  const Footprint kernel = kernels::fusedAttentionFootprint(one, /*ownsInputs=*/true);
  const double q = s.rows(s.heads * s.headDim), kv = s.batch * s.seq * (s.kvHeads / s.sp) * s.headDim * 4;
  Footprint f;
  for (int g = 0; g < groups; ++g) f.saved.add(kernel.saved);
  f.work.add(kernel.work);
  f.work.add(2, q);
  f.work.add(2, kv);
  f.work.add(3, q / groups);
  f.work.add(2, (q + 2 * kv) / groups);
  return f;
}

}  // namespace lt::sp
