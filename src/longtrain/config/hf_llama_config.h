// Hugging Face's config.json of a Llama, Qwen2, Qwen3 or Mistral, read into a ModelConfig and
// written from one. Non-obvious: reading refuses every field whose meaning longtrain does not
// implement (rope_scaling other than linear and llama3, MLP biases, an activation other than
// silu, Qwen's per-layer sliding windows) by name, rather than loading weights into a model
// that computes otherwise.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

#include "longtrain/config/model_config.h"

namespace lt::config {

struct HfLlamaConfig {
  ModelConfig model;          // the architecture fields; the rest stays at ModelConfig's defaults
  int64_t maxPositions = 0;   // max_position_embeddings (0: absent)
  std::string torchDtype;     // torch_dtype as written ("float32", "bfloat16", ...; "" if absent)
  int64_t bosId = -1, eosId = -1;
};

// Reads DIR/config.json. Errors name the file and the field, and `what`: the key or flag that
// gave DIR.
HfLlamaConfig readHfLlamaConfig(const std::string& dir, const std::string& what = "model.init_from");

// rope_scaling as Hugging Face writes it (null, or {"rope_type" | "type": ..., "factor": ...,
// llama3's "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}).
// Types other than default / linear / llama3 are refused by name; `what` names the source.
RopeScaling ropeScalingFromJson(const nlohmann::json& j, const std::string& what);
nlohmann::json ropeScalingJson(const RopeScaling& s);  // null for "none"

// The config.json of a LlamaForCausalLM (or Qwen2/Qwen3/Mistral's, by model.modelType) with this
// shape (torchDtype "float32" or "bfloat16").
nlohmann::json hfLlamaConfigJson(const HfLlamaConfig& c);

// longtrain's model keys and the Hugging Face fields they mirror, in config order.
struct HfKey {
  const char* ours;
  const char* theirs;
};
inline constexpr HfKey kHfModelKeys[] = {
    {"vocab_size", "vocab_size"},        {"hidden_size", "hidden_size"},
    {"num_layers", "num_hidden_layers"}, {"num_heads", "num_attention_heads"},
    {"num_kv_heads", "num_key_value_heads"}, {"intermediate_size", "intermediate_size"},
    {"rope_theta", "rope_theta"},        {"rms_norm_eps", "rms_norm_eps"},
    {"tie_word_embeddings", "tie_word_embeddings"},
    {"model_type", "model_type"},        {"head_dim", "head_dim"},
    {"attention_bias", "attention_bias"}, {"qk_norm", "q/k norms (model_type)"},
    {"sliding_window", "sliding_window"},
};

}  // namespace lt::config
