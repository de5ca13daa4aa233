// The config parser: one function per section, each reading its keys over the section's
// defaults (the struct's member initializers) and finishing the section, so a key nobody
// reads is reported. Rules that span sections live in validate.cpp.
#include "longtrain/config/parse.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <type_traits>

#include "longtrain/config/deepspeed_keys.h"
#include "longtrain/config/hf_llama_config.h"
#include "longtrain/config/json_reader.h"
#include "longtrain/config/json_text.h"
#include "longtrain/config/token_sidecar.h"
#include "longtrain/config/validate.h"
#include "longtrain/core/check.h"

namespace lt::config {

using json = nlohmann::json;

namespace {

constexpr int64_t kBig = int64_t(1) << 50;

// A key that takes "auto" besides its typed values (recorded as "auto" when it is).
bool isAuto(JsonReader& r, const std::string& key) {
  const json* v = r.find(key);
  if (!v || !v->is_string() || *v != "auto") return false;
  r.record(key, "auto");
  return true;
}

// sequence_parallel_ulysses_head_groups: "auto" (also when absent) is 0.
int parseHeadGroups(JsonReader& r) {
  const std::string key = "sequence_parallel_ulysses_head_groups";
  if (!r.find(key)) {
    r.record(key, "auto");
    return 0;
  }
  if (isAuto(r, key)) return 0;
  LT_CHECK(!r.find(key)->is_string(), "config key '", key, "' must be an integer or \"auto\", got ",
           r.find(key)->dump());
  return static_cast<int>(r.getInt(key, 0, 1, 1 << 20));
}

void parseTopLevel(JsonReader& r, Config& c) {
  c.trainBatchSize = r.getInt("train_batch_size", c.trainBatchSize, 1, kBig);
  c.microBatch = r.getInt("train_micro_batch_size_per_gpu", c.microBatch, 1, kBig);
  c.gradAccum = r.getInt("gradient_accumulation_steps", c.gradAccum, 1, kBig);
  c.gradientClipping = r.getNum("gradient_clipping", c.gradientClipping, 0.0, 1e30);
  c.stepsPerPrint = r.getInt("steps_per_print", c.stepsPerPrint, 1, kBig);
  c.seed = static_cast<uint64_t>(r.getInt("seed", static_cast<int64_t>(c.seed), 0, kBig));
  c.sequenceParallelSize = static_cast<int>(r.getInt("sequence_parallel_size", c.sequenceParallelSize, 1, 1 << 20));
  c.sequenceParallelRingDegree =
      static_cast<int>(r.getInt("sequence_parallel_ring_degree", c.sequenceParallelRingDegree, 0, 1 << 20));
  c.sequenceParallelBalance = r.getOption("sequence_parallel_balance", c.sequenceParallelBalance);
  c.sequenceParallelUlyssesHeadGroups = parseHeadGroups(r);
  c.activationCheckpointing = r.getOption("activation_checkpointing", c.activationCheckpointing);
  const auto* commType = r.find("communication_data_type");
  LT_CHECK(!commType || *commType != "fp16",
           "config key 'communication_data_type' = \"fp16\": fp16 is not implemented in this CPU build; use \"bf16\" ",
           "(gradients sent as bf16, summed in fp32) or \"fp32\"");
  c.precision.communication = r.getOption("communication_data_type", c.precision.communication);
}

OptimizerConfig parseOptimizer(JsonReader o) {
  OptimizerConfig c;
  c.type = o.getOption("type", c.type);
  JsonReader p = o.sub("params");
  c.adamWMode = p.getBool("adam_w_mode", c.adamWMode);
  c.lr = p.getNum("lr", c.lr, 0, 1e3);
  if (const json* b = p.find("betas")) {
    LT_CHECK(b->is_array() && b->size() == 2 && (*b)[0].is_number() && (*b)[1].is_number(), p.name("betas"),
             " must be a list of two numbers, got ", b->dump());
    c.beta1 = (*b)[0].get<double>();
    c.beta2 = (*b)[1].get<double>();
    LT_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1, p.name("betas"), " = ", b->dump(),
             " must lie in [0, 1)");
  }
  p.record("betas", json::array({c.beta1, c.beta2}));
  c.eps = p.getNum("eps", c.eps, 0, 1);
  c.weightDecay = p.getNum("weight_decay", c.weightDecay, 0, 1e3);
  p.finish();
  c.decayEmbeddings = o.getBool("decay_embeddings", c.decayEmbeddings);
  o.finish();
  return c;
}

SchedulerConfig parseScheduler(JsonReader s, bool present) {
  SchedulerConfig c;
  if (!present) return c;
  c.type = s.getOption("type", SchedulerType::WarmupLR,
                        {SchedulerType::WarmupLR, SchedulerType::WarmupDecayLR, SchedulerType::WarmupCosineLR});
  JsonReader p = s.sub("params");
  if (c.type != SchedulerType::WarmupCosineLR) {
    c.warmupMinLr = p.getNum("warmup_min_lr", c.warmupMinLr, 0, 1e3);
    c.warmupMaxLr = p.getNum("warmup_max_lr", c.warmupMaxLr, 0, 1e3);
  } else {
    c.warmupMinRatio = p.getNum("warmup_min_ratio", c.warmupMinRatio, 0, 1);
    c.cosMinRatio = p.getNum("cos_min_ratio", c.cosMinRatio, 0, 1);
  }
  if (c.type != SchedulerType::WarmupLR) {
    LT_CHECK(p.has("total_num_steps"), p.name("total_num_steps"), " is required by ", c.type, " (the step at ",
             "which the decay ends)");
    c.totalNumSteps = p.getInt("total_num_steps", c.totalNumSteps, 1, kBig);
  }
  c.warmupNumSteps = p.getInt("warmup_num_steps", c.warmupNumSteps, 1, kBig);
  c.warmupType = p.getOption("warmup_type", c.warmupType);
  p.finish();
  s.finish();
  return c;
}

void parsePrecision(JsonReader& root, Config& c) {
  JsonReader b = root.sub("bf16");
  PrecisionConfig& p = c.precision;
  p.bf16 = b.getBool("enabled", p.bf16);
  p.onlyIfFaster = b.getBool("only_if_faster", p.onlyIfFaster);
  p.attention = b.getBool("attention", p.attention);
  p.gathers = b.getBool("gathers", p.gathers);
  b.finish();
  JsonReader h = root.sub("fp16");
  LT_CHECK(!h.getBool("enabled", false), h.name("enabled"), " = true: fp16 with loss scaling is not implemented in ",
           "this CPU build; use bf16.enabled (no loss scaling needed) or set it to false (fp32)");
  h.finish();
}

ZeroConfig parseZero(JsonReader z) {
  ZeroConfig c;
  c.stage = static_cast<int>(z.getInt("stage", c.stage, 0, 3));
  c.subGroupSize = z.getInt("sub_group_size", c.subGroupSize, 1, kBig);
  c.reduceBucketSize = z.getInt("reduce_bucket_size", c.reduceBucketSize, 1, kBig);
  c.allgatherBucketSize = z.getInt("allgather_bucket_size", c.allgatherBucketSize, 1, kBig);
  c.overlapComm = z.getBool("overlap_comm", c.overlapComm);
  // DeepSpeed's switches for paths longtrain always takes: accepted when they say so.
  for (const char* key : {"contiguous_gradients", "reduce_scatter"})
    LT_CHECK(z.getBool(key, true), z.name(key), " = false: longtrain always copies gradients into contiguous ",
             "buckets and reduce-scatters them (stages 1-3); remove the key or set it to true");
  LT_CHECK(!z.getBool("round_robin_gradients", false), z.name("round_robin_gradients"), " = true: not implemented ",
           "(it balances CPU-offloaded gradient copies, which longtrain does not make); remove the key or set it ",
           "to false");
  c.prefetchBucketSize = z.getInt("stage3_prefetch_bucket_size", c.prefetchBucketSize, 0, kBig);
  c.paramPersistenceThreshold = z.getInt("stage3_param_persistence_threshold", c.paramPersistenceThreshold, 0, kBig);
  c.maxLiveParameters = z.getInt("stage3_max_live_parameters", c.maxLiveParameters, 0, kBig);
  JsonReader off = z.sub("offload_optimizer");
  c.offloadOptimizer.device = off.getOption("device", c.offloadOptimizer.device);
  c.offloadOptimizer.superOffload = off.getBool("super_offload", c.offloadOptimizer.superOffload);
  c.offloadOptimizer.ratio = off.getNum("ratio", c.offloadOptimizer.ratio, 0, 1);
  c.offloadOptimizer.cpuadamCoresPerc = off.getNum("cpuadam_cores_perc", c.offloadOptimizer.cpuadamCoresPerc, 0, 1);
  off.finish();
  z.finish();
  return c;
}

CompileConfig parseCompile(JsonReader r) {
  CompileConfig c;
  c.deepcompile = r.getBool("deepcompile", c.deepcompile);
  if (const json* sch = r.find("schedule")) {
    LT_CHECK(sch->is_array(), r.name("schedule"), " must be a list of [step, [\"pass\", ...]] entries, got ",
             sch->dump());
    c.schedule.emplace();
    for (size_t i = 0; i < sch->size(); ++i) {
      const json& e = (*sch)[i];
      bool ok = e.is_array() && e.size() == 2 && e[0].is_number_integer() && e[1].is_array();
      if (ok)
        for (const auto& n : e[1]) ok &= n.is_string();
      LT_CHECK(ok, "config key '", r.keyPath("schedule"), "[", i, "]' must be [step, [\"pass\", ...]] with an integer ",
               "step, got ", e.dump());
      c.schedule->push_back({e[0].get<int64_t>(), e[1].get<std::vector<std::string>>()});
    }
  }
  r.finish();
  return c;
}

template <class T>
std::string shown(T value) {
  if constexpr (std::is_enum_v<T>)
    return json(optionName(value)).dump();
  else
    return json(value).dump();
}

// The model's architecture keys, read over the Hugging Face config.json of model.init_from when
// it is given: a key given in both must agree, a key given only there is taken from it.
struct ModelKeys {
  JsonReader& m;
  const HfLlamaConfig* hf;
  std::string hfFile;
  template <class T>
  T agree(const char* key, T parsed, T theirs) {
    if (!hf || !m.has(key) || parsed == theirs) return parsed;
    const char* field = key;
    for (const auto& k : kHfModelKeys)
      if (std::string(k.ours) == key) field = k.theirs;
    LT_CHECK(false, m.name(key), " = ", shown(parsed), " disagrees with ", field, " = ", shown(theirs),
             " in '", hfFile, "' (model.init_from); remove the key or make them agree");
    return parsed;
  }
  int64_t integer(const char* key, int64_t def, int64_t hfValue, int64_t lo, int64_t hi) {
    return agree(key, m.getInt(key, hf ? hfValue : def, lo, hi), hfValue);
  }
  double number(const char* key, double def, double hfValue, double lo, double hi) {
    return agree(key, m.getNum(key, hf ? hfValue : def, lo, hi), hfValue);
  }
};

// model_type and the switches it defaults (config/model_config.h); validate.cpp checks that
// they form a model Hugging Face's class of that type has.
void parseVariant(ModelKeys& k, ModelConfig& mc, const ModelConfig& theirs) {
  JsonReader& m = k.m;
  const bool hf = k.hf != nullptr;
  mc.modelType = k.agree("model_type", m.getOption("model_type", theirs.modelType), theirs.modelType);
  mc.headDimension = k.integer("head_dim", 0, theirs.headDimension, 0, 1 << 20);
  mc.attentionBias = k.agree("attention_bias", m.getBool("attention_bias", theirs.attentionBias), theirs.attentionBias);
  mc.qkNorm = k.agree("qk_norm", m.getBool("qk_norm", hf ? theirs.qkNorm : mc.modelType == ModelType::Qwen3), theirs.qkNorm);
  mc.slidingWindow = k.integer("sliding_window", 0, theirs.slidingWindow, 0, kBig);
}

void parseArchitecture(JsonReader& m, ModelConfig& mc, const std::optional<HfLlamaConfig>& hf) {
  const ModelConfig theirs = hf ? hf->model : ModelConfig{};
  ModelKeys k{m, hf ? &*hf : nullptr, mc.initFrom + "/config.json"};
  mc.vocabSize = k.integer("vocab_size", mc.vocabSize, theirs.vocabSize, 2, kBig);
  mc.hidden = k.integer("hidden_size", mc.hidden, theirs.hidden, 2, kBig);
  mc.layers = k.integer("num_layers", mc.layers, theirs.layers, 1, 100000);
  mc.heads = k.integer("num_heads", mc.heads, theirs.heads, 1, 100000);
  mc.kvHeads = k.integer("num_kv_heads", mc.heads, theirs.kvHeads, 1, 100000);  // default: = num_heads
  mc.intermediate = k.integer("intermediate_size", 4 * mc.hidden, theirs.intermediate, 1, kBig);  // 4 x hidden
  // rope_theta and rope_scaling may override init_from's: context extension trains a model made
  // at a short length at a longer one with a larger theta or YaRN, and export writes what was used.
  mc.ropeTheta = m.getNum("rope_theta", hf ? theirs.ropeTheta : mc.ropeTheta, 1, 1e12);
  mc.normEps = k.number("rms_norm_eps", mc.normEps, theirs.normEps, 0, 1);
  mc.tieEmbeddings =
      k.agree("tie_word_embeddings", m.getBool("tie_word_embeddings", theirs.tieEmbeddings), theirs.tieEmbeddings);
  if (hf) mc.maxPositions = hf->maxPositions;
  const json* scaling = m.find("rope_scaling");
  mc.ropeScaling = scaling ? ropeScalingFromJson(*scaling, m.name("rope_scaling")) : theirs.ropeScaling;
  parseVariant(k, mc, theirs);
}

ModelConfig parseModel(JsonReader m) {
  ModelConfig mc;
  mc.initFrom = m.getString("init_from", mc.initFrom);
  std::optional<HfLlamaConfig> hf;
  if (!mc.initFrom.empty()) hf = readHfLlamaConfig(mc.initFrom);
  parseArchitecture(m, mc, hf);
  mc.initStd = m.getNum("init_std", mc.initStd, 0, 10);
  mc.attention = m.getOption("attention", mc.attention);
  mc.attentionChunk = m.getInt("attention_chunk", mc.attentionChunk, 0, kBig);
  mc.lossChunkAuto = isAuto(m, "loss_chunk");
  if (!mc.lossChunkAuto) mc.lossChunk = m.getInt("loss_chunk", mc.lossChunk, 0, kBig);
  mc.tiledMlpAuto = isAuto(m, "tiled_mlp");
  if (!mc.tiledMlpAuto) mc.tiledMlp = m.getBool("tiled_mlp", mc.tiledMlp);
  mc.fusedKernels = m.getBool("fused_kernels", mc.fusedKernels);
  mc.gemm = m.getOption("gemm", mc.gemm);
  m.finish();
  return mc;
}

DataConfig parseData(JsonReader d, const ModelConfig& model) {
  DataConfig c;
  c.type = d.getOption("type", c.type);
  c.path = d.getString("path", c.path);
  c.tokenizer = d.getString("tokenizer", c.tokenizer);
  c.packing = d.getOption("packing", c.packing);
  c.eosId = d.getInt("eos_id", c.eosId, -1, kBig);
  c.seqLen = d.getInt("seq_len", c.seqLen, 2, kBig);
  c.numSamples = d.getInt("num_samples", c.numSamples, 1, kBig);
  c.evalSamples = d.getInt("eval_samples", c.evalSamples, 0, kBig);
  c.evalFraction = d.getNum("eval_fraction", c.evalFraction, 0, 0.5);
  JsonReader kv = d.sub("kv");
  c.kvPairs = kv.getInt("num_pairs", c.kvPairs, 1, kBig);
  c.kvQueries = kv.getInt("num_queries", c.kvQueries, 1, kBig);
  c.kvKeys = kv.getInt("num_keys", c.kvKeys, 1, kBig);
  c.kvValues = kv.getInt("num_values", c.kvValues, 2, kBig);
  c.kvNoise = kv.getInt("num_noise", c.kvNoise, 1, kBig);
  c.kvFused = kv.getBool("fused_pairs", c.kvFused);
  kv.finish();
  d.finish();
  // Default: the tokenizer that comes with init_from's model (the directory: data::Tokenizer
  // takes its tokenizer.json, else its tokenizer.model).
  namespace fs = std::filesystem;
  if (c.tokenizer.empty() && !model.initFrom.empty())
    for (const char* name : {"tokenizer.json", "tokenizer.model"})
      if (fs::is_regular_file(fs::path(model.initFrom) / name)) c.tokenizer = model.initFrom;
  applyTokenSidecar(c);
  return c;
}

CheckpointConfig parseCheckpoint(JsonReader k) {
  CheckpointConfig c;
  c.dir = k.getString("dir", c.dir);
  c.everySteps = k.getInt("every_steps", c.everySteps, 0, kBig);
  c.keepLast = k.getInt("keep_last", c.keepLast, 0, kBig);
  c.async = k.getBool("async", c.async);
  c.onError = k.getOption("on_error", c.onError);
  k.finish();
  return c;
}

TrainSection parseTrain(JsonReader t) {
  TrainSection c;
  c.steps = t.getInt("steps", c.steps, 1, kBig);
  c.nproc = static_cast<int>(t.getInt("nproc", c.nproc, 1, 1024));
  c.threads = static_cast<int>(t.getInt("threads", c.threads, 0, 4096));
  c.evalEvery = t.getInt("eval_every", c.evalEvery, 0, kBig);
  c.sampleEvery = t.getInt("sample_every", c.sampleEvery, 0, kBig);
  c.sampleTokens = t.getInt("sample_tokens", c.sampleTokens, 1, 1 << 20);
  c.samplePrompt = t.getString("sample_prompt", c.samplePrompt);
  c.commTimeoutS = t.getNum("comm_timeout_s", c.commTimeoutS, 0.1, 1e6);
  c.peakFlops = t.getNum("peak_flops", c.peakFlops, 0, 1e18);
  c.memoryBudget = t.getBytes("memory_budget", c.memoryBudget);
  c.memoryPreflight = t.getBool("memory_preflight", c.memoryPreflight);
  c.offloadDir = t.getString("offload_dir", c.offloadDir);
  c.checkpoint = parseCheckpoint(t.sub("checkpoint"));
  JsonReader le = t.sub("eval");
  c.longEval.data = le.getString("data", c.longEval.data);
  c.longEval.seqLen = le.getInt("seq_len", c.longEval.seqLen, 0, kBig);
  c.longEval.windows = le.getInt("windows", c.longEval.windows, 1, kBig);
  c.longEval.dtype = le.getOption("dtype", c.longEval.dtype);
  c.longEval.packing = le.getOption("packing", c.longEval.packing);
  le.finish();
  t.finish();
  return c;
}

// The config as parsed, for the record (checkpoint manifests, export): with init_from, the
// model keys it supplied are written out, so the record stands without the directory.
std::string effectiveSource(json j, const ModelConfig& mc) {
  if (mc.initFrom.empty()) return j.dump();
  json& m = j["model"];
  m["vocab_size"] = mc.vocabSize;
  m["hidden_size"] = mc.hidden;
  m["num_layers"] = mc.layers;
  m["num_heads"] = mc.heads;
  m["num_kv_heads"] = mc.kvHeads;
  m["intermediate_size"] = mc.intermediate;
  m["rope_theta"] = mc.ropeTheta;
  m["rms_norm_eps"] = mc.normEps;
  m["tie_word_embeddings"] = mc.tieEmbeddings;
  if (mc.ropeScaling.type != RopeType::None) m["rope_scaling"] = ropeScalingJson(mc.ropeScaling);
  if (mc.modelType != ModelType::Llama) m["model_type"] = optionName(mc.modelType);  // the variant's keys, where not Llama's defaults
  if (mc.headDimension > 0) m["head_dim"] = mc.headDimension;
  if (mc.attentionBias) m["attention_bias"] = true;
  if (mc.qkNorm) m["qk_norm"] = true;
  if (mc.slidingWindow > 0) m["sliding_window"] = mc.slidingWindow;
  return j.dump();
}

}  // namespace

namespace {

// Every section, each read to its end however many of its keys are wrong: the problems of all
// of them are reported together.
Config parseSections(JsonReader& root, Problems& problems) {
  Config c;
  problems.attempt([&] { parseTopLevel(root, c); });
  problems.attempt([&] { c.optimizer = parseOptimizer(root.sub("optimizer")); });
  problems.attempt([&] { c.scheduler = parseScheduler(root.sub("scheduler"), root.has("scheduler")); });
  problems.attempt([&] { c.zero = parseZero(root.sub("zero_optimization")); });
  problems.attempt([&] { c.compile = parseCompile(root.sub("compile")); });
  problems.attempt([&] { c.model = parseModel(root.sub("model")); });
  problems.attempt([&] { parsePrecision(root, c); });
  problems.attempt([&] { c.data = parseData(root.sub("data"), c.model); });
  problems.attempt([&] { c.train = parseTrain(root.sub("train")); });
  root.finish();
  return c;
}

}  // namespace

Config parseConfig(const json& given, int world) {
  LT_CHECK(given.is_object(), "the config must be a JSON object, got ", given.type_name());
  auto problems = std::make_shared<Problems>();
  json j = given;
  const PortNotes port = settleDeepSpeedKeys(j, *problems);
  JsonReader root(&j, "");
  auto effective = std::make_shared<json>(json::object());
  root.recordInto(effective);
  root.collectInto(problems);
  Config c = parseSections(root, *problems);
  problems->throwIfAny();
  // WarmupLR and WarmupDecayLR peak at the optimizer's lr unless warmup_max_lr says otherwise.
  if (root.has("scheduler") && c.scheduler.type != SchedulerType::WarmupCosineLR && c.scheduler.warmupMaxLr < 0) {
    c.scheduler.warmupMaxLr = c.optimizer.lr;
    (*effective)["scheduler"]["params"]["warmup_max_lr"] = c.optimizer.lr;
  }
  c.source = effectiveSource(given, c.model);
  // What parsing resolved after the reads: the tokenizer and EOS from init_from or the sidecar.
  (*effective)["data"]["tokenizer"] = c.data.tokenizer;
  (*effective)["data"]["eos_id"] = c.data.eosId;
  validate(c, world);
  // ... and what validate() derives: the batch triple DeepSpeed's rule completes.
  (*effective)["train_batch_size"] = c.trainBatchSize;
  (*effective)["train_micro_batch_size_per_gpu"] = c.microBatch;
  (*effective)["gradient_accumulation_steps"] = c.gradAccum;
  c.effective = effective->dump(2);
  c.notices = portNotices(port, *effective);
  return c;
}

void applyOverride(json& j, const std::string& assignment) {
  auto eq = assignment.find('=');
  LT_CHECK(eq != std::string::npos && eq > 0, "--set '", assignment, "' must look like KEY=VALUE, e.g. ",
           "--set zero_optimization.stage=3");
  std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  checkJsonDepth(text, "--set '" + key + "'");  // before the parser builds (and destroys) a deep tree
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;  // a bare word: a string
  json* node = &j;
  std::stringstream ss(key);
  std::string part, walked;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  for (size_t i = 0; i < parts.size(); ++i) {
    LT_CHECK(!parts[i].empty(), "--set '", assignment, "': empty component in the key path");
    walked += (walked.empty() ? "" : ".") + parts[i];
    if (i + 1 == parts.size()) {
      (*node)[parts[i]] = value;
    } else {
      json& next = (*node)[parts[i]];
      if (next.is_null()) next = json::object();
      LT_CHECK(next.is_object(), "--set '", assignment, "': '", walked, "' is a ", next.type_name(),
               ", not an object");
      node = &next;
    }
  }
}

namespace {

// JSON keeps the last of two equal keys without a word; a config must not. The parser's
// callback sees every key with its object's depth: the path of the first duplicate is kept.
std::string firstDuplicateKey(std::istream& in) {
  std::vector<std::vector<std::string>> seen;  // keys of each open object
  std::vector<std::string> path;               // the key of each open object, from the root
  std::string pending, duplicate;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      seen.emplace_back();
      path.push_back(pending);
    } else if (ev == json::parse_event_t::object_end && !seen.empty()) {
      seen.pop_back();
      path.pop_back();
    } else if (ev == json::parse_event_t::key && !seen.empty()) {
      pending = parsed.get<std::string>();
      auto& keys = seen.back();
      if (duplicate.empty() && std::find(keys.begin(), keys.end(), pending) != keys.end()) {
        for (size_t i = 1; i < path.size(); ++i) duplicate += path[i] + ".";
        duplicate += pending;
      }
      keys.push_back(pending);
    }
    return true;
  };
  const json scanned = json::parse(in, cb, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  (void)scanned;  // only the callback's verdict matters (GCC ignores a (void) cast of the call)
  return duplicate;
}

}  // namespace

json loadConfigJson(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string what = "config file '" + path + "'";
  const std::string text = readJsonFile(path, what);
  json j = parseJsonText(text, what, /*comments=*/true);
  std::istringstream again(text);
  const std::string dup = firstDuplicateKey(again);
  LT_CHECK(dup.empty(), "config file '", path, "': key '", dup, "' appears twice (JSON would silently keep the ",
           "last one); remove one of them");
  for (const auto& o : overrides) applyOverride(j, o);
  return j;
}

Config loadConfig(const std::string& path, const std::vector<std::string>& overrides, int world) {
  return parseConfig(loadConfigJson(path, overrides), world);
}

std::map<std::string, std::string> agreedKeys(const Config& c) {
  std::map<std::string, std::string> out;
  const json flat = json::parse(c.source).flatten();  // named: items() only refers to it
  for (const auto& [pointer, v] : flat.items()) {  // "/a/b" -> "a.b"
    std::string key = pointer.substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    out[key] = v.dump();
  }
  return out;
}

}  // namespace lt::config
