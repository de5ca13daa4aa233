// config.json <-> ModelConfig. Hugging Face defaults (LlamaConfig's) apply to absent optional
// fields: num_key_value_heads = num_attention_heads, rope_theta 10000, rms_norm_eps 1e-6,
// tie_word_embeddings false, head_dim hidden_size / num_attention_heads. The model type decides
// the rest: Qwen2's q/k/v biases, Qwen3's q/k norms, Mistral's sliding_window.
#include "longtrain/config/hf_llama_config.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "longtrain/config/json_text.h"
#include "longtrain/core/check.h"

namespace lt::config {

using json = nlohmann::json;

namespace {

json readObject(const std::string& path, const std::string& what) {
  std::error_code ec;
  LT_CHECK(std::filesystem::exists(path, ec), what, ": '", path, "' does not exist (a Hugging Face model directory ",
           "holds config.json and model.safetensors)");
  json j = readJson(path, "'" + path + "'");
  LT_CHECK(j.is_object(), "'", path, "' is not a JSON object");
  return j;
}

int64_t intField(const json& j, const std::string& file, const char* key, int64_t def, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    LT_CHECK(!required, "'", file, "' lacks the field '", key, "' (a Llama config.json has it)");
    return def;
  }
  LT_CHECK(it->is_number_integer() && it->get<int64_t>() > 0, "'", file, "': '", key,
           "' must be a positive integer, got ", it->dump());
  return it->get<int64_t>();
}

double numField(const json& j, const std::string& file, const char* key, double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  LT_CHECK(it->is_number() && it->get<double>() > 0, "'", file, "': '", key, "' must be a positive number, got ",
           it->dump());
  return it->get<double>();
}

// An optional token id: an integer, or a list whose first entry is taken (Llama 3 lists several EOS).
int64_t tokenId(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return -1;
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int64_t>();
  return it->is_number_integer() ? it->get<int64_t>() : -1;
}

bool boolField(const json& j, const std::string& file, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  LT_CHECK(it->is_boolean(), "'", file, "': '", key, "' must be true or false, got ", it->dump());
  return it->get<bool>();
}

ModelType modelTypeOf(const json& j, const std::string& file) {
  const std::string type = j.value("model_type", std::string("llama"));
  const auto known = optionFromName<ModelType>(type);
  LT_CHECK(known.has_value(), "'", file, "': model_type \"", type, "\" is not supported; longtrain loads \"llama\", ",
           "\"qwen2\", \"qwen3\" and \"mistral\"");
  return *known;
}

void refuseUnimplemented(const json& j, const std::string& file, ModelType type) {
  const std::string act = j.value("hidden_act", std::string("silu"));
  LT_CHECK(act == "silu", "'", file, "': hidden_act \"", act, "\" is not implemented (the SwiGLU MLP uses silu)");
  LT_CHECK(!boolField(j, file, "mlp_bias"), "'", file, "': mlp_bias = true is not implemented (no MLP biases)");
  LT_CHECK(type != ModelType::Mistral || !boolField(j, file, "attention_bias"), "'", file,
           "': attention_bias = true: Mistral's projections have no biases; remove the field");
  if (type == ModelType::Qwen2 || type == ModelType::Qwen3)
    LT_CHECK(!boolField(j, file, "use_sliding_window"), "'", file, "': use_sliding_window = true is not ",
             "implemented for ", optionName(type), " (its window covers only some layers: max_window_layers / layer_types); ",
             "longtrain has Mistral's window on every layer");
  if (auto it = j.find("layer_types"); it != j.end() && it->is_array())
    for (const auto& t : *it)
      LT_CHECK(t == "full_attention", "'", file, "': layer_types holds ", t.dump(), "; only \"full_attention\" ",
               "layers are implemented (per-layer sliding windows are not)");
}

// head_dim when given and not hidden / heads (0 otherwise: derived).
int64_t headDimOf(const json& j, const std::string& file, const ModelConfig& m) {
  const int64_t given = intField(j, file, "head_dim", 0, false);
  LT_CHECK(given > 0 || m.hidden % m.heads == 0, "'", file, "': hidden_size ", m.hidden,
           " is not a multiple of num_attention_heads ", m.heads, " and there is no head_dim");
  return given > 0 && !(m.hidden % m.heads == 0 && given == m.hidden / m.heads) ? given : 0;
}

// The variant's switches from model_type and its own fields.
void readVariant(const json& j, const std::string& file, ModelConfig& m) {
  m.modelType = modelTypeOf(j, file);
  refuseUnimplemented(j, file, m.modelType);
  m.headDimension = headDimOf(j, file, m);
  m.attentionBias = m.modelType != ModelType::Qwen2 && boolField(j, file, "attention_bias");
  m.qkNorm = m.modelType == ModelType::Qwen3;
  if (m.modelType == ModelType::Mistral) m.slidingWindow = intField(j, file, "sliding_window", 0, false);
}

double scalingNumber(const json& j, const std::string& what, const char* key, double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  LT_CHECK(it->is_number() && it->get<double>() > 0, what, ": rope_scaling.", key, " must be a positive number, got ",
           it->dump());
  return it->get<double>();
}

}  // namespace

RopeScaling ropeScalingFromJson(const json& j, const std::string& what) {
  RopeScaling s;
  if (j.is_null()) return s;
  LT_CHECK(j.is_object(), what, ": rope_scaling must be an object or null, got ", j.dump());
  const std::string kind = j.value("rope_type", j.value("type", std::string("?")));
  if (kind == "default") return s;
  LT_CHECK(kind == "linear" || kind == "llama3" || kind == "yarn", what, ": rope_scaling type \"", kind,
           "\" is not implemented (longtrain has \"default\", \"linear\", \"llama3\" and \"yarn\"); the model ",
           "would compute other positions than it was trained on");
  s.type = *optionFromName<RopeType>(kind);
  s.factor = scalingNumber(j, what, "factor", 0);
  LT_CHECK(s.factor > 0, what, ": rope_scaling type \"", kind, "\" needs \"factor\"");
  if (s.type == RopeType::Llama3) {
    s.lowFreqFactor = scalingNumber(j, what, "low_freq_factor", 1);
    s.highFreqFactor = scalingNumber(j, what, "high_freq_factor", 4);
    s.originalMaxPositions = static_cast<int64_t>(scalingNumber(j, what, "original_max_position_embeddings", 0));
    LT_CHECK(s.originalMaxPositions > 0 && s.highFreqFactor > s.lowFreqFactor, what,
             ": rope_scaling \"llama3\" needs original_max_position_embeddings and high_freq_factor > low_freq_factor");
  }
  if (kind == "yarn") {
    s.originalMaxPositions = static_cast<int64_t>(scalingNumber(j, what, "original_max_position_embeddings", 0));
    LT_CHECK(s.originalMaxPositions > 0, what, ": rope_scaling \"yarn\" needs original_max_position_embeddings ",
             "(the context the model was trained at)");
    s.betaFast = scalingNumber(j, what, "beta_fast", 32);
    s.betaSlow = scalingNumber(j, what, "beta_slow", 1);
    s.attentionFactor = scalingNumber(j, what, "attention_factor", 0);
    s.mscale = scalingNumber(j, what, "mscale", 0);
    s.mscaleAllDim = scalingNumber(j, what, "mscale_all_dim", 0);
    if (auto it = j.find("truncate"); it != j.end() && !it->is_null()) {
      LT_CHECK(it->is_boolean(), what, ": rope_scaling.truncate must be true or false, got ", it->dump());
      s.truncate = it->get<bool>();
    }
  }
  return s;
}

json ropeScalingJson(const RopeScaling& s) {
  if (s.type == RopeType::None) return nullptr;
  json j{{"rope_type", optionName(s.type)}, {"factor", s.factor}};
  if (s.type == RopeType::Llama3) {
    j["low_freq_factor"] = s.lowFreqFactor;
    j["high_freq_factor"] = s.highFreqFactor;
    j["original_max_position_embeddings"] = s.originalMaxPositions;
  }
  if (s.type == RopeType::Yarn) {
    j["original_max_position_embeddings"] = s.originalMaxPositions;
    j["beta_fast"] = s.betaFast;
    j["beta_slow"] = s.betaSlow;
    if (s.attentionFactor > 0) j["attention_factor"] = s.attentionFactor;
    if (s.mscale > 0) j["mscale"] = s.mscale;
    if (s.mscaleAllDim > 0) j["mscale_all_dim"] = s.mscaleAllDim;
    if (!s.truncate) j["truncate"] = false;
  }
  return j;
}

namespace {
HfLlamaConfig fromJson(const json& j, const std::string& file);  // config.json's fields, below
}  // namespace

HfLlamaConfig readHfLlamaConfig(const std::string& dir, const std::string& what) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  std::error_code ec;
  LT_CHECK(std::filesystem::is_directory(dir, ec), what, ": '", dir, "' is not a directory (give the ",
           "Hugging Face model directory that holds config.json and model.safetensors)");
  const json j = readObject(file, what);
  try {  // a field of an unexpected type (model_type: {}) is named, not nlohmann's type_error
    return fromJson(j, file);
  } catch (const json::exception& e) {
    LT_CHECK(false, "'", file, "' has a field of the wrong type (", e.what(), ")");
  }
  return {};
}

namespace {

HfLlamaConfig fromJson(const json& j, const std::string& file) {
  HfLlamaConfig c;
  ModelConfig& m = c.model;
  m.vocabSize = intField(j, file, "vocab_size", 0, true);
  m.hidden = intField(j, file, "hidden_size", 0, true);
  m.layers = intField(j, file, "num_hidden_layers", 0, true);
  m.heads = intField(j, file, "num_attention_heads", 0, true);
  m.kvHeads = intField(j, file, "num_key_value_heads", m.heads, false);
  m.intermediate = intField(j, file, "intermediate_size", 0, true);
  m.ropeTheta = numField(j, file, "rope_theta", 10000.0);
  m.normEps = numField(j, file, "rms_norm_eps", 1e-6);
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && !it->is_null()) {
    LT_CHECK(it->is_boolean(), "'", file, "': tie_word_embeddings must be true or false, got ", it->dump());
    m.tieEmbeddings = it->get<bool>();
  }
  LT_CHECK(m.heads % m.kvHeads == 0, "'", file, "': num_attention_heads ", m.heads,
           " is not a multiple of num_key_value_heads ", m.kvHeads);
  readVariant(j, file, m);
  if (auto it = j.find("rope_scaling"); it != j.end()) m.ropeScaling = ropeScalingFromJson(*it, "'" + file + "'");
  c.maxPositions = intField(j, file, "max_position_embeddings", 0, false);
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) c.torchDtype = it->get<std::string>();
  c.bosId = tokenId(j, "bos_token_id");
  c.eosId = tokenId(j, "eos_token_id");
  return c;
}

}  // namespace

namespace {

const char* architectureOf(ModelType type) {
  switch (type) {
    case ModelType::Qwen2: return "Qwen2ForCausalLM";
    case ModelType::Qwen3: return "Qwen3ForCausalLM";
    case ModelType::Mistral: return "MistralForCausalLM";
    case ModelType::Llama: break;
  }
  return "LlamaForCausalLM";
}

// The fields that differ between the model types (their configuration classes' own).
void writeVariant(const ModelConfig& m, json& j) {
  const ModelType t = m.modelType;
  if (t == ModelType::Llama || t == ModelType::Qwen3) j["attention_bias"] = m.attentionBias;
  if (t == ModelType::Llama) j["mlp_bias"] = false;
  if (t == ModelType::Qwen2 || t == ModelType::Qwen3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = m.layers;
  }
  if (t == ModelType::Mistral) j["sliding_window"] = m.slidingWindow > 0 ? json(m.slidingWindow) : json(nullptr);
}

}  // namespace

json hfLlamaConfigJson(const HfLlamaConfig& c) {
  const ModelConfig& m = c.model;
  json j{{"architectures", {architectureOf(m.modelType)}},
         {"model_type", optionName(m.modelType)},
         {"torch_dtype", c.torchDtype.empty() ? "float32" : c.torchDtype},
         {"vocab_size", m.vocabSize},
         {"hidden_size", m.hidden},
         {"num_hidden_layers", m.layers},
         {"num_attention_heads", m.heads},
         {"num_key_value_heads", m.kvHeads},
         {"head_dim", m.headDim()},
         {"intermediate_size", m.intermediate},
         {"hidden_act", "silu"},
         {"rope_theta", m.ropeTheta},
         {"rope_scaling", ropeScalingJson(m.ropeScaling)},
         {"rms_norm_eps", m.normEps},
         {"tie_word_embeddings", m.tieEmbeddings},
         {"max_position_embeddings", c.maxPositions},
         {"attention_dropout", 0.0},
         {"initializer_range", m.initStd},
         {"use_cache", true}};
  writeVariant(m, j);
  if (c.bosId >= 0) j["bos_token_id"] = c.bosId;
  if (c.eosId >= 0) j["eos_token_id"] = c.eosId;
  return j;
}

}  // namespace lt::config
