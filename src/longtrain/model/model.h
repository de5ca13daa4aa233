// Llama-style decoder on raw ATen tensors (autograd records every op; no torch::nn):
// embedding, RMSNorm, RoPE from position_ids, grouped-query causal attention, SwiGLU MLP,
// final norm, LM head (optionally tied). The Qwen2/Qwen3/Mistral variants add, per the config,
// q/k/v(/o) biases, per-head q/k RMSNorm before RoPE and a sliding window (in the attention
// core). Parameters are grouped per block, plus a "head"
// group (final norm, LM head) and an "embed" group (the embedding; with tied embeddings also
// the LM head): the units of gather/reduce/offload. The LM head's gradient is final right
// after the loss, the embedding's only at the very end of backward, hence two groups.
// Init is deterministic from the seed, per parameter, identical on every rank; the variants'
// extra parameters take indices only when present, so a Llama's init is what it always was.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "longtrain/config/model_config.h"
#include "longtrain/model/kernels.h"

namespace lt::model {

// The model's config section (config/model_config.h): its shape and kernel choices.
using config::ModelConfig;
using config::RopeScaling;

// RoPE's inverse frequencies theta^(-2i/headDim), i < headDim/2, with the scaling applied, in
// `dtype`. Without scaling exactly the ops model::rope always ran.
at::Tensor ropeInverseFrequencies(int64_t headDim, double theta, const RopeScaling& scaling, at::ScalarType dtype);

// The core of attention: q [B, S, H, Dh], k and v [B, S, KV, Dh], already rotated, over the
// whole sequence; returns [B, S, H, Dh]. `packedPositions` is undefined for plain causal
// attention; with packed documents it is the position ids [B, S] (restarting at 0 per
// document), and no query attends to a key of another document. Ulysses SP substitutes a core
// that all-to-alls (and gathers the positions of the whole sequence).
using AttentionFn = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& packedPositions)>;

// The route the engine chose for the model's GEMMs (model.gemm, bf16.enabled); see gemm.h.
GemmRoute gemmRoute(const ModelConfig& c);
// model.gemm resolved on this CPU (what a run, its plan and a model loaded to evaluate or generate
// all take): "onednn" and "blas" as told, "auto" kernels::oneDnnIsTheFp32Default's rule.
bool oneDnnRunsFp32Gemms(config::GemmChoice gemm);

// Whether the fused attention core runs its tile products on bf16 operands: under the bf16 GEMM
// route with bf16.attention, on a CPU with AVX512_BF16 (elsewhere attention stays fp32 under bf16).
bool attentionInBf16(const ModelConfig& c);

// The attention core cfg.attention names, with its tile (cfg.attentionChunk) and the sliding
// window (cfg.slidingWindow, by sequence index: the core sees the whole sequence).
AttentionFn attentionCore(const ModelConfig& cfg);
// The fused core's kernel options (its tile, bf16 products): attentionCore's and those of
// Ulysses' pipelined path, which runs the kernel itself per head group (sp/ulysses.h).
FusedAttentionOptions fusedAttentionOptions(const ModelConfig& cfg);

// Plain causal attention with GQA (KV heads repeated to H). Materializes [B, H, S, S]. With
// packedPositions, block-diagonal causal over the documents they mark.
at::Tensor causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& packedPositions = {});
// The same with Mistral's sliding window W > 0: query i sees only keys j > i - W (written as its
// own mask here, the reference the other cores' first-visible-key form is tested against).
at::Tensor slidingWindowAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& packedPositions, int64_t window);

at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w, double eps);
// x [B, S, H, Dh], pos [B, S]: rotary embedding with the half-split layout (Hugging Face Llama).
at::Tensor rope(const at::Tensor& x, const at::Tensor& pos, double theta, const RopeScaling& scaling = {});

// What a parameter is to the model. A Matrix is read only through the block's and the head's
// GEMMs; the token embedding is looked up (and read by a tied LM head); a Vector is a norm's
// weight or a bias. Optimizers take their per-parameter rules from it (weight decay, bf16 copies).
enum class ParamRole { Matrix, Embedding, Vector };

struct NamedParam {
  std::string name;
  at::Tensor tensor;
  ParamRole role = ParamRole::Vector;  // set by the Model from the parameter's name and shape
};

class Model {
 public:
  // initialize=false leaves the weights uninitialized (at::empty: pages untouched until
  // written, so a model whose weights are loaded next never needs its random init in memory).
  Model(const ModelConfig& cfg, uint64_t seed, bool initialize = true);

  const ModelConfig& config() const { return cfg_; }
  int numBlocks() const { return static_cast<int>(cfg_.layers); }
  int headGroup() const { return numBlocks(); }       // final norm (+ LM head if untied)
  int embedGroup() const { return numBlocks() + 1; }  // embedding (= LM head if tied)
  int numGroups() const { return numBlocks() + 2; }
  // Groups in Hugging Face parameter order: embed, blocks 0..L-1, head.
  std::vector<int> groupOrder() const;

  // The forward pieces. Non-const where they write the model's gradients or its RoPE table and
  // loss buffer (kept from call to call), so one Model serves one thread at a time.
  at::Tensor embed(const at::Tensor& ids) const;  // [B,S] -> [B,S,D]
  // Accumulates dLoss/d(embedding weight) from dLoss/d(embed(ids)); reads no weight values,
  // so under ZeRO-3 the embedding need not be gathered for it.
  void embedBackward(const at::Tensor& ids, const at::Tensor& gradOut);
  // One decoder block, [B,S,D] -> [B,S,D], for training and decoding alike: `attn` sees the
  // block's rotated q, k, v of these S tokens; a decoding core (generate.h) keeps k and v in a
  // KV cache and attends over it. `pos` [B,S] are the tokens' absolute positions.
  at::Tensor block(int b, const at::Tensor& x, const at::Tensor& pos, const AttentionFn& attn);
  at::Tensor logits(const at::Tensor& x) const;  // [B,S,D] -> [B,S,V]

  // The LM head fused with the loss, for one tile h [B, T, D] and its shift labels [B, T]: the
  // final norm (under autograd), the logits GEMM, log-softmax, loss and, when `scale` != 0,
  // dL/dlogits = scale x (softmax - onehot) in the logits' own buffer, then dL/dW accumulated
  // into the LM head's (or tied embedding's) gradient and dL/dh returned through the norm.
  // Only one [B x T, V] buffer exists (the autograd path holds three).
  struct TileLoss {
    double sum = 0;
    int64_t count = 0, correct = 0;
    at::Tensor gradH;  // [B, T, D] when scale != 0
  };
  TileLoss headLoss(const at::Tensor& h, const at::Tensor& shiftLabels, double scale);

  // Parameters of a group, with Hugging Face Llama names.
  const std::vector<NamedParam>& group(int g) const { return groups_[g]; }
  std::vector<at::Tensor> parameters() const;  // in groupOrder()

  // Whole-model forward with plain autograd: the reference the step program is tested against.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& pos, const AttentionFn& attn);

 private:
  struct Block {
    at::Tensor attnNorm, wq, wk, wv, wo, mlpNorm, wGate, wUp, wDown;
    at::Tensor bq, bk, bv, bo, qNorm, kNorm;  // undefined unless the config has them
  };
  struct Qkv {
    at::Tensor q, k, v;  // [B, S, heads, Dh], biased and (q, k) normed, not yet rotated
  };
  // Fused kernels: one GEMM against [wq; wk; wv] and views of its columns.
  Qkv projectQkv(const Block& k, const at::Tensor& h) const;
  at::Tensor outputProjection(const Block& k, const at::Tensor& a) const;
  // RoPE's cos/sin for the positions last seen: every block of a step shares one table.
  // Keyed by the positions' values (a freed tensor's address can come back with new ones).
  struct RopeCache {
    at::Tensor pos, cos, sin;
  };
  std::pair<at::Tensor, at::Tensor> ropeTableFor(const at::Tensor& pos);
  at::Tensor rotate(const at::Tensor& x, const at::Tensor& pos);  // RoPE, fused or not per the config
  at::Tensor norm(const at::Tensor& x, const at::Tensor& w) const;
  ModelConfig cfg_;
  RopeCache rope_;
  // headLoss's [B x tile, V] buffer, kept from call to call and grown when a tile needs more:
  // freed and allocated anew each step, tcmalloc left the freed span fragmented by the next
  // step's smaller allocations and mapped a second one (measured: +1 buffer from step 2 on).
  at::Tensor headBuffer_;
  at::Tensor embed_, finalNorm_, lmHead_;
  std::vector<Block> blocks_;
  std::vector<std::vector<NamedParam>> groups_;
};

// Sum of token cross-entropies over shift_labels != -100, and their count.
struct LossSum {
  at::Tensor sum;  // scalar, differentiable
  int64_t count = 0;
  int64_t correct = 0;  // argmax hits among counted tokens
};
LossSum lossSum(const at::Tensor& logits, const at::Tensor& shiftLabels);

}  // namespace lt::model
