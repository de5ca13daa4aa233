// Long-sequence kernels as custom autograd functions. Chunked (flash-style) causal attention: memory O(S x chunk) instead of O(S^2). Forward runs
// an online softmax over key blocks and saves only the output and the per-row log-sum-exp;
// backward recomputes each block's scores from them (a custom autograd function). Same
// shapes and GQA convention as model::causalAttention, so it drops into Ulysses unchanged.
#pragma once
#include <ATen/core/Tensor.h>

#include "longtrain/config/model_config.h"
#include "longtrain/model/kernels.h"

namespace lt::model {

// q [B, S, H, Dh], k and v [B, S, KV, Dh] -> [B, S, H, Dh]; blocks of `chunk` rows and columns
// (S need not be a multiple of chunk). With packedPositions [B, S], block-diagonal causal over
// the documents they mark (model::AttentionFn's contract); with window W > 0, query i sees keys
// j > i - W only, and key blocks wholly left of a query block's window are skipped.
at::Tensor chunkedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t chunk,
                            const at::Tensor& packedPositions = {}, int64_t window = 0);

// DeepSpeed's TiledMLP: the SwiGLU MLP down(silu(gate(x)) * up(x)) over `shards` sequence
// shards; forward keeps none of the [B, S, intermediate] activations, backward recomputes
// them shard by shard. x [B, S, D] -> [B, S, D].
struct MlpOptions {
  bool fused = false;  // gate and up as one GEMM and the fused SwiGLU (fused_ops.h); else ATen's
  GemmRoute gemm = GemmRoute::Blas;  // how its GEMMs run (model::linear)
};
at::Tensor tiledMlp(const at::Tensor& x, const at::Tensor& wGate, const at::Tensor& wUp, const at::Tensor& wDown,
                    int64_t shards, MlpOptions options = {});

// The model's rules around the kernels' inputs: which keys a query may see, and RoPE's angles.

// The first position of each token's document when position ids restart at 0 per document
// (Hugging Face's packing convention): start[s] = s - pos[s]. pos [B, S] -> [B, S] int64.
at::Tensor documentStartFromPositions(const at::Tensor& pos);

// The first key each of the [batch, seq] queries may see: its document's start (packedPositions
// defined) and, with a sliding window W > 0, nothing W or more tokens back: max(start, s - W + 1).
// Within a document positions differ as indices do, so the window is on position differences.
// Undefined when neither applies (plain causal). The chunked, fused and ring cores take this
// (the fused kernel as FusedAttentionOptions::documentStart).
at::Tensor firstVisibleKey(const at::Tensor& packedPositions, int64_t batch, int64_t seq, int64_t window);

// RoPE's per-token angles for kernels::fusedRope, computed once per step and shared by every
// block's q and k: cos and sin [B, S, Dh/2] of pos [B, S] x theta^(-2i/Dh), the same ops (and
// roundings) as model::rope.
RopeTable ropeTable(const at::Tensor& pos, int64_t headDim, double theta, const config::RopeScaling& scaling = {});

}  // namespace lt::model
