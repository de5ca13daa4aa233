// The model's section of the config: a Llama-style decoder's shape (Llama, Qwen2, Qwen3 or
// Mistral: the same block with biases, q/k norms or a sliding window) and its kernels' choices. Plain data, no libtorch, so every module (the model, the memory model, checkpoints,
// the Hugging Face reader) shares one definition. Non-obvious: the defaults below are the
// parsed defaults too (the parser reads over a default-constructed struct), except the two
// derived from other keys: num_kv_heads (= num_heads) and intermediate_size (= 4 x hidden).
#pragma once
#include <cstdint>
#include <string>

#include "longtrain/config/options.h"

namespace lt::config {

// Hugging Face's rope_scaling: "none" (plain RoPE), "linear" (every frequency / factor),
// "llama3" (Llama 3.1's: low frequencies / factor, high ones kept, a smooth ramp between) or
// "yarn" (YaRN: frequencies that complete beta_fast rotations within the original context
// kept, those under beta_slow divided by factor, a linear ramp between, and cos/sin scaled by
// an attention factor).
struct RopeScaling {
  RopeType type = RopeType::None;
  double factor = 1, lowFreqFactor = 1, highFreqFactor = 4;
  int64_t originalMaxPositions = 0;
  double betaFast = 32, betaSlow = 1;  // yarn
  double attentionFactor = 0;          // yarn: 0 = derived (0.1 ln factor + 1, or the mscale ratio)
  double mscale = 0, mscaleAllDim = 0;  // yarn, DeepSeek's form of the derived attention factor
  bool truncate = true;                 // yarn: correction range rounded outwards to whole dims
  // The factor cos and sin are multiplied by: yarn's attention factor, else 1.
  double attentionScale() const;
};

// The model's kernel choices a run resolves at start from the config, the CPU and measurements
// (config::RunPlan), and every rank agrees on.
struct KernelChoices {
  bool bf16Gemms = false;        // bf16.enabled resolved: projections, MLP, LM head in bf16, fp32 outputs
  bool bf16Attention = false;    // bf16.attention resolved: the fused attention's tile products in bf16
  bool oneDnnGemm = false;       // model.gemm resolved: fp32 GEMMs on oneDNN's sgemm
  bool packedDocuments = false;  // data.packing "documents": attention stops at document boundaries
};

struct ModelConfig {
  int64_t vocabSize = 64, hidden = 64, layers = 2, heads = 4, kvHeads = 4, intermediate = 256;
  double ropeTheta = 10000.0, normEps = 1e-5, initStd = 0.02;
  RopeScaling ropeScaling;
  bool tieEmbeddings = false;
  // model.init_from: a Hugging Face Llama directory whose config.json gave the fields above
  // and whose safetensors give the initial weights ("" : random init from the seed).
  std::string initFrom;
  int64_t maxPositions = 0;  // max_position_embeddings of init_from (0: unknown); recorded on export
  // The attention core: "fused" (kernels/fused_attention.h, the default), "chunked" or "naive";
  // the last two are the references the fused kernel is tested against.
  AttentionKernel attention = AttentionKernel::Fused;
  int64_t attentionChunk = 0;  // tile edge of "fused" and "chunked"; 0: theirs (128) / 256
  int64_t lossChunk = 0;       // 0: logits of the whole sequence at once; else tiles of this many tokens
  bool tiledMlp = false;       // MLP over ceil(S / hidden) sequence shards (DeepSpeed's TiledMLP)
  // "auto" for either: the run plan chooses against the memory budget (plan::chooseTiling) and
  // config::RunPlan::model writes the choice into the two fields above.
  bool lossChunkAuto = false, tiledMlpAuto = false;
  // Fused RMSNorm, SwiGLU and RoPE, q/k/v and gate/up each one GEMM; false: the ATen
  // composition, the reference the fused path is tested against. Parameters are the same.
  bool fusedKernels = true;
  // fp32 GEMMs: "blas" (ATen's: OpenBLAS), "onednn" (oneDNN's sgemm, its kernel chosen from
  // cpuid) or "auto": whichever the engine measures faster on every rank at start-up.
  GemmChoice gemm = GemmChoice::Auto;
  // What the run plan chose for the kernels (config::RunPlan::model); never parsed.
  KernelChoices resolved;

  // Hugging Face's model_type: "llama", "qwen2", "qwen3" or "mistral". It sets the defaults of
  // the switches below and the config.json export writes; the block computes from the switches.
  ModelType modelType = ModelType::Llama;
  int64_t headDimension = 0;   // head_dim; 0: hidden / heads
  bool attentionBias = false;  // attention_bias (Llama, Qwen3, Mistral): q, k, v and o biases
  bool qkNorm = false;         // Qwen3: RMSNorm over each head of q and k, before RoPE
  int64_t slidingWindow = 0;   // Mistral: query i sees keys i-W < j <= i (0: no window)

  int64_t headDim() const { return headDimension > 0 ? headDimension : hidden / heads; }
  int64_t qDim() const { return heads * headDim(); }  // q_proj's outputs, o_proj's inputs
  // Qwen2 has q, k and v biases whatever attention_bias says, and never an o_proj bias.
  bool qkvBias() const { return modelType == ModelType::Qwen2 || attentionBias; }
  bool oBias() const { return modelType != ModelType::Qwen2 && attentionBias; }
  // Parameter counts, the one definition the model, the memory model and MFU use.
  int64_t blockParams() const;  // 2 norms, q/k/v/o (+ biases, q/k norms), SwiGLU's three matrices
  int64_t embedParams() const { return vocabSize * hidden; }
  int64_t headParams() const { return hidden + (tieEmbeddings ? 0 : vocabSize * hidden); }  // final norm + LM head
  int64_t numParams() const { return layers * blockParams() + embedParams() + headParams(); }
};

}  // namespace lt::config
