// Blockwise causal attention. Blocks above the diagonal are skipped; the diagonal block is
// masked. Everything runs in the input dtype on [B, H, rows, cols] tiles.
#include "longtrain/model/attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "longtrain/core/check.h"
#include "longtrain/kernels/footprint.h"
#include "longtrain/model/footprint.h"
#include "longtrain/model/model.h"

namespace lt::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Scores of query rows [qs, qe) against key columns [ks, ke), causally masked, and with `start`
// ([B, S], defined for packed documents) also left of each row's document start. [B, H, r, c]
at::Tensor blockScores(const at::Tensor& q, const at::Tensor& k, int64_t qs, int64_t qe, int64_t ks, int64_t ke,
                       double scale, const at::Tensor& start) {
  auto s = at::matmul(q.slice(2, qs, qe), k.slice(2, ks, ke).transpose(-2, -1)) * scale;
  auto cols = at::arange(ks, ke, q.options().dtype(at::kLong)).unsqueeze(0);
  if (ke > qs + 1) {  // some column lies right of some row's diagonal
    auto rows = at::arange(qs, qe, q.options().dtype(at::kLong)).unsqueeze(1);
    s = s.masked_fill(cols > rows, -std::numeric_limits<float>::infinity());
  }
  if (start.defined()) {
    auto before = cols < start.slice(1, qs, qe).unsqueeze(-1);  // [B, r, c]
    s = s.masked_fill(before.unsqueeze(1), -std::numeric_limits<float>::infinity());
  }
  return s;
}

// The first key block query rows [qs, qe) need: 0, or with a sliding window (`skip`) the block
// of their smallest first visible key (`start`). Only windows skip: packed documents alone keep
// the loop over every block they always ran.
int64_t firstKeyBlock(const at::Tensor& start, bool skip, int64_t qs, int64_t qe, int64_t chunk) {
  if (!skip) return 0;
  return start.slice(1, qs, qe).min().item<int64_t>() / chunk * chunk;
}

struct ChunkedFn : torch::autograd::Function<ChunkedFn> {
  // q, k, v: [B, H, S, D] (KV already expanded to H heads).
  // documents: [B, S] document starts (packed documents), or empty.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t chunk, const at::Tensor& documents, bool window) {
    const at::Tensor start = documents.numel() > 0 ? documents : at::Tensor();
    at::NoGradGuard ng;
    const int64_t S = q.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    auto out = at::empty_like(q);
    auto lse = at::empty({q.size(0), q.size(1), S}, q.options());
    for (int64_t qs = 0; qs < S; qs += chunk) {
      const int64_t qe = std::min(S, qs + chunk);
      at::Tensor m, l, acc;
      for (int64_t ks = firstKeyBlock(start, window, qs, qe, chunk); ks < qe; ks += chunk) {
        const int64_t ke = std::min(qe, ks + chunk);
        auto s = blockScores(q, k, qs, qe, ks, ke, scale, start);  // [B, H, r, c]
        auto bm = std::get<0>(s.max(-1, true));
        // A row whose document starts right of this block sees no key here: a finite max
        // keeps exp(-inf - max) at 0 instead of NaN.
        if (start.defined()) bm = at::clamp_min(bm, -1e30);
        auto mNew = m.defined() ? at::maximum(m, bm) : bm;
        auto p = at::exp(s - mNew);
        auto pv = at::matmul(p, v.slice(2, ks, ke));
        if (m.defined()) {
          auto corr = at::exp(m - mNew);
          l = l * corr + p.sum(-1, true);
          acc = acc * corr + pv;
        } else {
          l = p.sum(-1, true);
          acc = pv;
        }
        m = mNew;
      }
      out.slice(2, qs, qe).copy_(acc / l);
      lse.slice(2, qs, qe).copy_((m + at::log(l)).squeeze(-1));
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["start"] = documents;
    ctx->saved_data["window"] = window;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::NoGradGuard ng;
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), S = q.size(2);
    at::Tensor start = ctx->saved_data["start"].toTensor();
    if (start.numel() == 0) start = at::Tensor();
    const bool window = ctx->saved_data["window"].toBool();
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    auto dO = grads[0].contiguous();
    auto delta = (dO * out).sum(-1, true);  // [B, H, S, 1]
    auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    for (int64_t qs = 0; qs < S; qs += chunk) {
      const int64_t qe = std::min(S, qs + chunk);
      auto dOi = dO.slice(2, qs, qe), qi = q.slice(2, qs, qe);
      auto lsei = lse.slice(2, qs, qe).unsqueeze(-1), deltai = delta.slice(2, qs, qe);
      for (int64_t ks = firstKeyBlock(start, window, qs, qe, chunk); ks < qe; ks += chunk) {
        const int64_t ke = std::min(qe, ks + chunk);
        auto p = at::exp(blockScores(q, k, qs, qe, ks, ke, scale, start) - lsei);  // [B, H, r, c]
        dv.slice(2, ks, ke).add_(at::matmul(p.transpose(-2, -1), dOi));
        auto dp = at::matmul(dOi, v.slice(2, ks, ke).transpose(-2, -1));
        auto ds = p * (dp - deltai) * scale;
        dq.slice(2, qs, qe).add_(at::matmul(ds, k.slice(2, ks, ke)));
        dk.slice(2, ks, ke).add_(at::matmul(ds.transpose(-2, -1), qi));
      }
    }
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor mlp(const at::Tensor& x, const at::Tensor& wGate, const at::Tensor& wUp, const at::Tensor& wDown,
               MlpOptions o) {
  if (o.fused) {
    const bool bf16 = o.gemm == GemmRoute::Bf16;  // gu saved as bf16, as the GEMMs' operands are
    return linear(fusedSwiglu(linear(x, at::cat({wGate, wUp}), o.gemm), isaBest(), bf16), wDown, o.gemm);
  }
  return linear(at::silu(linear(x, wGate, o.gemm)) * linear(x, wUp, o.gemm), wDown, o.gemm);
}

struct TiledMlpFn : torch::autograd::Function<TiledMlpFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& wGate,
                            const at::Tensor& wUp, const at::Tensor& wDown, int64_t shards, bool fused, int64_t gemm) {
    at::NoGradGuard ng;
    const int64_t S = x.size(1), len = (S + shards - 1) / shards;
    auto out = at::empty_like(x);
    for (int64_t s0 = 0; s0 < S; s0 += len) {
      const int64_t s1 = std::min(S, s0 + len);
      out.slice(1, s0, s1).copy_(mlp(x.slice(1, s0, s1), wGate, wUp, wDown, {fused, static_cast<GemmRoute>(gemm)}));
    }
    ctx->save_for_backward({x, wGate, wUp, wDown});
    ctx->saved_data["len"] = len;
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["gemm"] = gemm;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const int64_t S = saved[0].size(1), len = ctx->saved_data["len"].toInt();
    const MlpOptions o{ctx->saved_data["fused"].toBool(), static_cast<GemmRoute>(ctx->saved_data["gemm"].toInt())};
    auto dx = at::empty_like(saved[0]);
    std::vector<at::Tensor> dw{at::zeros_like(saved[1]), at::zeros_like(saved[2]), at::zeros_like(saved[3])};
    at::AutoGradMode on(true);
    for (int64_t s0 = 0; s0 < S; s0 += len) {
      const int64_t s1 = std::min(S, s0 + len);
      auto xs = saved[0].slice(1, s0, s1).detach().requires_grad_(true);
      std::vector<at::Tensor> w;
      for (int i = 1; i <= 3; ++i) w.push_back(saved[i].detach().requires_grad_(true));
      auto y = mlp(xs, w[0], w[1], w[2], o);
      auto g = torch::autograd::grad({y}, {xs, w[0], w[1], w[2]}, {grads[0].slice(1, s0, s1)});
      dx.slice(1, s0, s1).copy_(g[0]);
      for (int i = 0; i < 3; ++i) dw[i].add_(g[i + 1]);
    }
    return {dx, dw[0], dw[1], dw[2], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor tiledMlp(const at::Tensor& x, const at::Tensor& wGate, const at::Tensor& wUp, const at::Tensor& wDown,
                    int64_t shards, MlpOptions options) {
  LT_ASSERT(shards >= 1);
  if (shards == 1) return mlp(x, wGate, wUp, wDown, options);
  return TiledMlpFn::apply(x, wGate, wUp, wDown, shards, options.fused, static_cast<int64_t>(options.gemm));
}

at::Tensor chunkedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t chunk,
                            const at::Tensor& packedPositions, int64_t window) {
  LT_CHECK(chunk >= 1, "model.attention_chunk=", chunk, " must be at least 1");
  const int64_t h = q.size(2), kv = k.size(2);
  LT_ASSERT(h % kv == 0);
  // Expanding KV outside the custom function lets autograd sum the copies' gradients.
  auto kk = kv == h ? k : k.repeat_interleave(h / kv, 2);
  auto vv = kv == h ? v : v.repeat_interleave(h / kv, 2);
  const at::Tensor start = firstVisibleKey(packedPositions, q.size(0), q.size(1), window);
  auto o = ChunkedFn::apply(q.transpose(1, 2).contiguous(), kk.transpose(1, 2).contiguous(),
                            vv.transpose(1, 2).contiguous(), chunk,
                            // autograd's apply needs a defined tensor: an empty one means "no mask"
                            start.defined() ? start : at::empty({0}, at::kLong), window > 0);
  return o.transpose(1, 2);  // [B, S, H, D]
}

at::Tensor documentStartFromPositions(const at::Tensor& pos) {
  auto rows = at::arange(pos.size(1), pos.options().dtype(at::kLong)).unsqueeze(0);
  return (rows - pos.to(at::kLong)).contiguous();
}

at::Tensor firstVisibleKey(const at::Tensor& packedPositions, int64_t batch, int64_t seq, int64_t window) {
  at::Tensor start = packedPositions.defined() ? documentStartFromPositions(packedPositions) : at::Tensor();
  if (window <= 0) return start;
  auto inWindow = (at::arange(seq, at::kLong) - (window - 1)).clamp_min(0).unsqueeze(0);  // [1, S]
  return (start.defined() ? at::maximum(start, inWindow) : inWindow.expand({batch, seq})).contiguous();
}

RopeTable ropeTable(const at::Tensor& pos, int64_t headDim, double theta, const RopeScaling& scaling) {
  auto inv = ropeInverseFrequencies(headDim, theta, scaling, at::kFloat);
  auto ang = pos.to(at::kFloat).unsqueeze(-1) * inv;  // [B, S, Dh/2]
  const double scale = scaling.attentionScale();  // yarn's attention factor scales both
  if (scale == 1) return {at::cos(ang).contiguous(), at::sin(ang).contiguous()};
  return {(at::cos(ang) * scale).contiguous(), (at::sin(ang) * scale).contiguous()};
}

// Footprints (footprint.h; units as in model.cpp's).

// ChunkedFn saves contiguous q, k, v ([B, H/P, S, Dh], KV expanded) and its output, and the
// log-sum-exp ([B, H/P, S]). Backward: dO made contiguous, dq, dk, dv, and per tile the scores,
// p, dp, ds and a temporary ([B, H/P, c, c]).
Footprint chunkedAttentionFootprint(const StepShape& s) {
  const double q = s.rows(s.heads * s.headDim), hP = s.heads / s.sp, c = std::min(s.attentionTile, s.seq);
  Footprint f;
  f.saved.add(4, q);
  f.saved.add(1, s.batch * hP * s.seq * 4);
  f.work.add(4, q);
  f.work.add(5, s.batch * hP * c * c * 4);
  return f;
}

// The MLP half. The norm saves its input x1 and (the GEMM) its output, the unfused norm also
// x1 * rsqrt (2 uD, unfused 3; measured on row 6, see blockFootprint). Untiled SwiGLU saves
// gate(x), silu(gate), up(x) and their product (4 uF); fused, the gate/up GEMM's output
// [B, S/P, 2F] is what the fused SwiGLU saves, down_proj saves the product (uF) and the GEMM
// [wGate; wUp]. The bf16 GEMM route with fused ops: the GEMMs save bf16 copies of their
// inputs, so the normed inputs halve while o_proj adds a half-size copy of the attention output
// (net -0.5 uD), SwiGLU saves gu as bf16 (2 -> 1 uF) and down_proj its input (1 -> 0.5 uF).
// TiledMlpFn saves only its fp32 input (the half's -0.5 + 0.5 uD: nothing).
Footprint mlpFootprint(const ModelConfig& m, const StepShape& s) {
  const double uD = s.rows(s.hidden), uF = s.rows(s.intermediate), DF = s.hidden * s.intermediate * 4;
  const bool fused = m.fusedKernels, bf16 = m.resolved.bf16Gemms && fused;
  Footprint f;
  f.saved.add(fused ? (bf16 && !m.tiledMlp ? 1.5 : 2) : 3, uD);
  if (fused) f.saved.add(2, DF);
  if (m.tiledMlp) {
    // TiledMlpFn::backward: dx, zeroed weight-gradient accumulators and one shard's weight
    // gradients (6 D x F), one shard's recompute and its gradients (~7 [B, len, F], len =
    // ceil(S/P / shards) <= hidden).
    f.work.add(1, uD);
    f.work.add(6, DF);
    f.work.add(7, s.batch * std::min(s.tokens, s.hidden) * s.intermediate * 4);
  } else {
    // d(product), d(silu), d(up) coexist at the mul's backward (fused: d(product) and d(gate,
    // up), one [B, S/P, 2F] tensor; bf16: the gate/up GEMM's backward rounds d(gate, up), one
    // uF more), but down_proj's backward has already freed the product it saved (1 uF), which
    // d(product) replaces: 2 uF over the saved bytes (bf16 3). dm comes after SwiGLU's saved
    // inputs are freed (smaller). Measured on row 6: Backward peaks 15.9 MiB over its start, 2 uF = 16.
    f.saved.add(fused ? (bf16 ? 1.5 : 3) : 4, uF);
    if (fused) f.work.add(1, 2 * uF);
    else f.work.add(2, uF);
    if (bf16) {
      // And each of its six GEMMs' own scratch, as oneDNN sizes it (without its bf16 kernel the
      // widened operands: [2F, T] and [T, D] for d[wGate; wUp]). Row 23 of bench/plan_accuracy.sh
      // (bf16 on AVX2, 16384 tokens) measured 20 MiB in use over the count without it.
      const double T = s.batch * s.tokens, D = s.hidden, F = s.intermediate;
      f.work.add(1, uF);
      f.scratch.add(1, std::max({kernels::bf16GemmWorkBytes(false, true, T, 2 * F, D),   // gate, up
                                 kernels::bf16GemmWorkBytes(false, true, T, D, F),       // down
                                 kernels::bf16GemmWorkBytes(false, false, T, D, 2 * F),  // dx
                                 kernels::bf16GemmWorkBytes(true, false, 2 * F, D, T),   // d[wGate; wUp]
                                 kernels::bf16GemmWorkBytes(false, false, T, F, D),      // d(product)
                                 kernels::bf16GemmWorkBytes(true, false, D, F, T)}));    // d(wDown)
    }
  }
  return f;
}

}  // namespace lt::model
