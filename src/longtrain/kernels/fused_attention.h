// Fused causal attention for CPUs: the default attention core. Blocked over query and key tiles
// with an online softmax (no [S, S] matrix, memory O(tile^2) per thread), causal tiles above the
// diagonal skipped, GQA kv heads read in place (no repeated copies), the log-sum-exp saved for a
// backward that recomputes each tile. An optional per-row first visible key makes it
// block-diagonal causal (packed documents) and/or banded (a sliding window): tiles wholly left
// of every row's first key are skipped, so a window makes long sequences O(S x W).
// Non-obvious: the tile products are this module's own register-blocked micro-GEMMs, not BLAS
// calls: at head dims of 16-128 a BLAS call per 64 x 64 tile spends more on packing than on math.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "longtrain/kernels/isa.h"

namespace torch::autograd {
struct AutogradContext;
}

namespace lt::kernels {

// How the backward shares out its work (attention_kernels.h, BackwardPart); the bits are the same.
// PerKvHead: a task per (batch, kv head). PerTile: a task per key tile (dk, dv), then per query tile
// (dq), at ~1.5x the work. Auto: PerTile where batch x kv heads leaves threads idle.
enum class BackwardPlan { Auto, PerKvHead, PerTile };

struct FusedAttentionOptions {
  // [B, S] int64: the first position row s may attend to (the start of its document), non-
  // decreasing along s and <= s. Undefined: plain causal attention.
  at::Tensor documentStart;
  int64_t tile = 0;  // query and key tile edge; 0: the kernel's default (256 or 128 by the L2 size)
  Isa isa = isaBest();  // Avx512Bf16 runs the Avx512 build unless bf16
  // Tile products on bf16-rounded operands with fp32 accumulation (vdpbf16ps; the softmax, the
  // saved log-sum-exp, the output and the gradients stay fp32): the model's attention under the
  // bf16 GEMM route. Needs isa == Avx512Bf16 (fusedAttentionBf16Supported()).
  bool bf16 = false;
  // Query row s sits at key position s + queryOffset: it sees keys [documentStart[s], s +
  // queryOffset], and k, v may hold another number of tokens than q. 0 with as many keys as
  // queries: causal self-attention. A ring step runs one block of queries over another shard's
  // keys with it (sp/ring_attention.cpp); a row that sees no key gets a zero output and a
  // log-sum-exp of -inf, and documentStart[s] may then be s + queryOffset + 1.
  int64_t queryOffset = 0;
  // fusedAttentionBackward's plan (tests, benches); the autograd function always runs Auto.
  BackwardPlan backwardPlan = BackwardPlan::Auto;
};

// Whether this CPU runs the bf16 tile products: isaSupported(Isa::Avx512Bf16).
bool fusedAttentionBf16Supported();
// Whether they run on AMX tiles (the CPU has AMX-BF16, the OS grants the tile state, and
// turnOffAmxForTesting is off); otherwise on vdpbf16ps.
bool fusedAttentionBf16OnAmx();
// Their engine by name, for banners: "AMX", "AVX512_BF16" (vdpbf16ps), or "none".
const char* fusedAttentionBf16Engine();
// Tests: run the bf16 products on vdpbf16ps even where AMX is there (false: back to the default).
void turnOffAmxForTesting(bool off);

// q [B, S, H, Dh], k and v [B, Sk, KV, Dh] (fp32, H a multiple of KV; Sk = S unless
// queryOffset says where the queries sit among the keys) -> [B, S, H, Dh]; the
// same contract as model::causalAttention, differentiable in q, k and v. The document mask comes
// from model::firstVisibleKey (the packing and sliding-window rules are the model's).
at::Tensor fusedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const FusedAttentionOptions& options = {});

// The kernel's forward and backward without autograd, for a caller that runs it piecewise
// inside its own autograd Function (sp/ulysses.cpp, one head group at a time). Each head's
// output, log-sum-exp and gradients depend on that head (and its kv head) alone, so running
// the heads in groups gives the bits of one call on all of them.
struct FusedAttentionResult {
  at::Tensor out;  // [B, S, H, Dh]
  at::Tensor lse;  // [B, H, S]: the row log-sum-exps backward needs
};
struct FusedAttentionGrads {
  at::Tensor dq, dk, dv;
};
FusedAttentionResult fusedAttentionForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const FusedAttentionOptions& options = {});
// dout: the gradient of `out`; q, k, v, out, lse as forward took and gave them.
FusedAttentionGrads fusedAttentionBackward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const FusedAttentionResult& forward, const at::Tensor& dout,
                                           const FusedAttentionOptions& options = {});

// The options' round trip through an autograd Function's context, for a Function that runs the
// kernels: its forward saves them (`start` empty when there is no mask, as the Function's
// arguments carry it), its backward reads them back.
void saveOptions(torch::autograd::AutogradContext* ctx, const at::Tensor& start, int64_t tile, Isa isa, bool bf16,
                 int64_t queryOffset = 0);
FusedAttentionOptions savedOptions(torch::autograd::AutogradContext* ctx);

}  // namespace lt::kernels
