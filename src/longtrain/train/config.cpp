// Strict JSON config reader. Each section records the keys it reads; whatever is left over
// is an unknown key, reported with the closest known one.
#include "longtrain/train/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include <fmt/format.h>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "longtrain/core/check.h"
#include "longtrain/core/strings.h"
#include "longtrain/model/hf_config.h"

namespace lt::train {

using json = nlohmann::json;

namespace {

std::string typeName(const json& v) { return v.type_name(); }

constexpr int64_t kBigBytes = int64_t(1) << 60;

class Section {
 public:
  Section(const json* j, std::string path) : j_(j), path_(std::move(path)) {
    LT_CHECK(!j_ || j_->is_object(), "config key '", path_, "' must be an object, got ", typeName(*j_), " ",
             j_->dump());
  }
  std::string keyPath(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const json* find(const std::string& key) {
    known_.push_back(key);
    if (!j_) return nullptr;
    auto it = j_->find(key);
    return it == j_->end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return j_ && j_->contains(key) && !(*j_)[key].is_null(); }

  int64_t getInt(const std::string& key, int64_t def, int64_t lo, int64_t hi) {
    const json* v = find(key);
    if (!v) return def;
    // A float counts when it is a whole number in int64 range (checked before the cast, which
    // is undefined behaviour outside it).
    auto whole = [](double d) { return std::abs(d) < 9.0e18 && d == std::trunc(d); };
    bool integral = v->is_number_integer() || (v->is_number_float() && whole(v->get<double>()));
    LT_CHECK(integral, "config key '", keyPath(key), "' must be an integer, got ", typeName(*v), " ", v->dump());
    LT_CHECK(!(v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX), "config key '", keyPath(key), "' = ",
             v->dump(), " is out of range; expected ", lo, " <= value <= ", hi);
    int64_t x = v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(v->get<double>());
    LT_CHECK(x >= lo && x <= hi, "config key '", keyPath(key), "' = ", x, " is out of range; expected ", lo,
             " <= value <= ", hi);
    return x;
  }
  double getNum(const std::string& key, double def, double lo, double hi) {
    const json* v = find(key);
    if (!v) return def;
    LT_CHECK(v->is_number(), "config key '", keyPath(key), "' must be a number, got ", typeName(*v), " ", v->dump());
    double x = v->get<double>();
    LT_CHECK(x >= lo && x <= hi, "config key '", keyPath(key), "' = ", x, " is out of range; expected ", lo,
             " <= value <= ", hi);
    return x;
  }
  bool getBool(const std::string& key, bool def) {
    const json* v = find(key);
    if (!v) return def;
    LT_CHECK(v->is_boolean(), "config key '", keyPath(key), "' must be true or false, got ", typeName(*v), " ",
             v->dump());
    return v->get<bool>();
  }
  std::string getString(const std::string& key, const std::string& def) {
    const json* v = find(key);
    if (!v) return def;
    LT_CHECK(v->is_string(), "config key '", keyPath(key), "' must be a string, got ", typeName(*v), " ", v->dump());
    return v->get<std::string>();
  }
  std::string getEnum(const std::string& key, const std::string& def, std::initializer_list<const char*> choices) {
    std::string s = getString(key, def);
    std::string list;
    for (const char* c : choices) {
      if (s == c) return s;
      list += std::string(list.empty() ? "" : ", ") + "\"" + c + "\"";
    }
    LT_CHECK(false, "config key '", keyPath(key), "' = \"", s, "\" is not one of ", list);
    return s;
  }
  // A byte count: a non-negative integer, or a string with a unit ("4GiB", "512MiB").
  int64_t getBytes(const std::string& key, int64_t def) {
    const json* v = find(key);
    if (!v) return def;
    if (v->is_string()) return parseByteSize(v->get<std::string>(), "config key '" + keyPath(key) + "'");
    return getInt(key, def, 0, kBigBytes);
  }
  Section sub(const std::string& key) {
    const json* v = find(key);
    return Section(v, keyPath(key));
  }
  // Any key present but never read is unknown: report it with the closest known key.
  void finish() const {
    if (!j_) return;
    for (auto it = j_->begin(); it != j_->end(); ++it) {
      if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
      std::string best = closestName(it.key(), known_);
      LT_CHECK(false, "unknown config key '", keyPath(it.key()), "'",
               best.empty() ? std::string() : "; did you mean '" + keyPath(best) + "'?",
               " (see the README's configuration reference)");
    }
  }

 private:
  const json* j_;
  std::string path_;
  std::vector<std::string> known_;
};

constexpr int64_t kBig = int64_t(1) << 50;

void resolveBatch(Config& c, int worldSize) {
  LT_CHECK(worldSize % c.sequenceParallelSize == 0, "sequence_parallel_size=", c.sequenceParallelSize,
           " does not divide the world size ", worldSize, "; choose a divisor of ", worldSize);
  const int64_t dp = worldSize / c.sequenceParallelSize;
  int64_t tb = c.trainBatchSize, mb = c.microBatch, ga = c.gradAccum;
  // DeepSpeed's rules: any two of the three determine the third; one alone means no accumulation.
  if (tb && mb && ga) {
  } else if (tb && mb) {
    ga = tb / mb / dp;
  } else if (tb && ga) {
    mb = tb / dp / ga;
  } else if (mb && ga) {
    tb = mb * ga * dp;
  } else if (tb) {
    ga = 1;
    mb = tb / dp;
  } else if (mb) {
    ga = ga ? ga : 1;
    tb = mb * ga * dp;
  } else {
    LT_CHECK(false, "set train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed's batch keys)");
  }
  LT_CHECK(mb > 0 && ga > 0 && tb == mb * ga * dp, "inconsistent batch sizes: train_batch_size=", tb,
           " must equal train_micro_batch_size_per_gpu=", mb, " x gradient_accumulation_steps=", ga,
           " x data-parallel size=", dp, " (world ", worldSize, " / sequence_parallel_size ",
           c.sequenceParallelSize, ") = ", mb * ga * dp, "; fix one of the three keys or the number of ranks");
  c.trainBatchSize = tb;
  c.microBatch = mb;
  c.gradAccum = ga;
}

// The model's architecture keys, read over the Hugging Face config.json of model.init_from when
// it is given: a key given in both must agree, a key given only there is taken from it.
struct ModelKeys {
  Section& m;
  const model::HfLlamaConfig* hf;
  std::string hfFile;
  template <class T>
  T agree(const char* key, T parsed, T theirs) {
    if (!hf || !m.has(key) || parsed == theirs) return parsed;
    const char* field = key;
    for (const auto& k : model::kHfModelKeys)
      if (std::string(k.ours) == key) field = k.theirs;
    LT_CHECK(false, "config key 'model.", key, "' = ", nlohmann::json(parsed).dump(), " disagrees with ", field, " = ",
             nlohmann::json(theirs).dump(), " in '", hfFile, "' (model.init_from); remove the key or make them agree");
    return parsed;
  }
  int64_t integer(const char* key, int64_t def, int64_t hfValue, int64_t lo, int64_t hi) {
    return agree(key, m.getInt(key, hf ? hfValue : def, lo, hi), hfValue);
  }
  double number(const char* key, double def, double hfValue, double lo, double hi) {
    return agree(key, m.getNum(key, hf ? hfValue : def, lo, hi), hfValue);
  }
};

model::ModelConfig parseModel(Section m) {
  model::ModelConfig mc;
  mc.initFrom = m.getString("init_from", "");
  std::optional<model::HfLlamaConfig> hf;
  if (!mc.initFrom.empty()) hf = model::readHfLlamaConfig(mc.initFrom);
  const model::ModelConfig theirs = hf ? hf->model : model::ModelConfig{};
  ModelKeys k{m, hf ? &*hf : nullptr, mc.initFrom + "/config.json"};
  mc.vocabSize = k.integer("vocab_size", 64, theirs.vocabSize, 2, kBig);
  mc.hidden = k.integer("hidden_size", 64, theirs.hidden, 2, kBig);
  mc.layers = k.integer("num_layers", 2, theirs.layers, 1, 100000);
  mc.heads = k.integer("num_heads", 4, theirs.heads, 1, 100000);
  mc.kvHeads = k.integer("num_kv_heads", mc.heads, theirs.kvHeads, 1, 100000);
  mc.intermediate = k.integer("intermediate_size", 4 * mc.hidden, theirs.intermediate, 1, kBig);
  mc.ropeTheta = k.number("rope_theta", 10000.0, theirs.ropeTheta, 1, 1e12);
  mc.normEps = k.number("rms_norm_eps", 1e-5, theirs.normEps, 0, 1);
  mc.tieEmbeddings = k.agree("tie_word_embeddings", m.getBool("tie_word_embeddings", theirs.tieEmbeddings),
                             theirs.tieEmbeddings);
  if (hf) mc.maxPositions = hf->maxPositions;
  const json* scaling = m.find("rope_scaling");
  mc.ropeScaling = scaling ? model::ropeScalingFromJson(*scaling, "config key 'model.rope_scaling'") : theirs.ropeScaling;
  LT_CHECK(!hf || !scaling || model::ropeScalingJson(mc.ropeScaling) == model::ropeScalingJson(theirs.ropeScaling),
           "config key 'model.rope_scaling' = ", model::ropeScalingJson(mc.ropeScaling).dump(),
           " disagrees with rope_scaling = ", model::ropeScalingJson(theirs.ropeScaling).dump(), " in '", k.hfFile,
           "' (model.init_from); remove the key or make them agree");
  mc.initStd = m.getNum("init_std", 0.02, 0, 10);
  mc.attention = m.getEnum("attention", "fused", {"fused", "chunked", "naive"});
  mc.attentionChunk = m.getInt("attention_chunk", 0, 0, kBig);
  mc.lossChunk = m.getInt("loss_chunk", 0, 0, kBig);
  mc.tiledMlp = m.getBool("tiled_mlp", false);
  mc.fusedKernels = m.getBool("fused_kernels", true);
  m.finish();
  LT_CHECK(mc.hidden % mc.heads == 0, "model.hidden_size=", mc.hidden, " must be divisible by model.num_heads=",
           mc.heads);
  LT_CHECK(mc.heads % mc.kvHeads == 0, "model.num_heads=", mc.heads, " must be divisible by model.num_kv_heads=",
           mc.kvHeads);
  LT_CHECK(mc.headDim() % 2 == 0, "model.hidden_size / model.num_heads = ", mc.headDim(),
           " must be even (RoPE rotates pairs)");
  return mc;
}

// The config as parsed, for the record (checkpoint manifests, export): with init_from, the
// model keys it supplied are written out, so the record stands without the directory.
std::string effectiveSource(json j, const model::ModelConfig& mc) {
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
  if (mc.ropeScaling.type != "none") m["rope_scaling"] = model::ropeScalingJson(mc.ropeScaling);
  return j.dump();
}

}  // namespace

// Sizes the engine and the memory model multiply together must not overflow 64-bit
// arithmetic (each key alone is range-checked; their products are not): refused naming the keys.
void checkProductsFit(const Config& c) {
  struct Product {
    const char* what;
    std::vector<std::pair<const char*, int64_t>> factors;
  };
  const int64_t widest = std::max({c.model.hidden, c.model.intermediate, c.model.vocabSize});
  const Product products[] = {
      {"activation elements of one micro-batch",
       {{"data.seq_len", c.data.seqLen}, {"train_micro_batch_size_per_gpu", c.microBatch},
        {"the widest of model.hidden_size, intermediate_size, vocab_size", widest}, {"model.num_layers", c.model.layers}}},
      {"weights of one layer", {{"model.hidden_size", c.model.hidden}, {"model.intermediate_size", c.model.intermediate},
                                {"model.num_layers", c.model.layers}}},
      {"embedding weights", {{"model.vocab_size", c.model.vocabSize}, {"model.hidden_size", c.model.hidden}}}};
  std::vector<Product> all(std::begin(products), std::end(products));
  // Only naive attention holds a micro-batch's scores at once; fused and chunked attention tile them.
  if (c.model.attention == "naive")
    all.push_back({"attention scores of one micro-batch",
                   {{"data.seq_len", c.data.seqLen}, {"data.seq_len", c.data.seqLen}, {"model.num_heads", c.model.heads},
                    {"train_micro_batch_size_per_gpu", c.microBatch}}});
  for (const auto& p : all) {
    long double v = 16;  // bytes per element with Adam's state, and headroom
    std::string keys;
    for (const auto& [k, x] : p.factors) {
      v *= static_cast<long double>(x);
      keys += fmt::format("{}{} = {}", keys.empty() ? "" : " x ", k, x);
    }
    LT_CHECK(v < static_cast<long double>(INT64_MAX), "config: the ", p.what, " (", keys,
             ") overflow 64-bit arithmetic; lower the largest of these keys");
  }
}

Config parseConfig(const json& j, int worldSize) {
  LT_CHECK(j.is_object(), "the config must be a JSON object, got ", j.type_name());
  Config c;
  Section root(&j, "");
  c.trainBatchSize = root.getInt("train_batch_size", 0, 1, kBig);
  c.microBatch = root.getInt("train_micro_batch_size_per_gpu", 0, 1, kBig);
  c.gradAccum = root.getInt("gradient_accumulation_steps", 0, 1, kBig);
  c.gradientClipping = root.getNum("gradient_clipping", 0.0, 0.0, 1e30);
  c.stepsPerPrint = root.getInt("steps_per_print", 10, 1, kBig);
  c.seed = static_cast<uint64_t>(root.getInt("seed", 1234, 0, kBig));
  c.sequenceParallelSize = static_cast<int>(root.getInt("sequence_parallel_size", 1, 1, 1 << 20));
  c.sequenceParallelRingDegree = static_cast<int>(root.getInt("sequence_parallel_ring_degree", 0, 0, 1 << 20));
  c.sequenceParallelBalance = root.getEnum("sequence_parallel_balance", "auto", {"auto", "contiguous", "zigzag"});
  c.activationCheckpointing = root.getEnum("activation_checkpointing", "auto", {"auto", "all", "none"});

  {
    Section o = root.sub("optimizer");
    c.optimizer.type = o.getEnum("type", "AdamW", {"AdamW", "Adam"});
    Section p = o.sub("params");
    c.optimizer.lr = p.getNum("lr", 1e-3, 0, 1e3);
    if (const json* b = p.find("betas")) {
      LT_CHECK(b->is_array() && b->size() == 2 && (*b)[0].is_number() && (*b)[1].is_number(),
               "config key 'optimizer.params.betas' must be a list of two numbers, got ", b->dump());
      c.optimizer.beta1 = (*b)[0].get<double>();
      c.optimizer.beta2 = (*b)[1].get<double>();
      LT_CHECK(c.optimizer.beta1 >= 0 && c.optimizer.beta1 < 1 && c.optimizer.beta2 >= 0 && c.optimizer.beta2 < 1,
               "config key 'optimizer.params.betas' = ", b->dump(), " must lie in [0, 1)");
    }
    c.optimizer.eps = p.getNum("eps", 1e-8, 0, 1);
    c.optimizer.weightDecay = p.getNum("weight_decay", 0.01, 0, 1e3);
    p.finish();
    c.optimizer.decayEmbeddings = o.getBool("decay_embeddings", false);
    o.finish();
  }
  {
    Section s = root.sub("scheduler");
    if (root.has("scheduler")) {
      c.scheduler.type = s.getEnum("type", "WarmupLR", {"WarmupLR", "WarmupCosineLR"});
      Section p = s.sub("params");
      if (c.scheduler.type == "WarmupLR") {
        c.scheduler.warmupMinLr = p.getNum("warmup_min_lr", 0, 0, 1e3);
        c.scheduler.warmupMaxLr = p.getNum("warmup_max_lr", -1, 0, 1e3);
      } else {
        c.scheduler.totalNumSteps = p.getInt("total_num_steps", 0, 1, kBig);
        LT_CHECK(p.has("total_num_steps"), "config key 'scheduler.params.total_num_steps' is required by ",
                 "WarmupCosineLR (the step at which the cosine reaches cos_min_ratio)");
        c.scheduler.warmupMinRatio = p.getNum("warmup_min_ratio", 0, 0, 1);
        c.scheduler.cosMinRatio = p.getNum("cos_min_ratio", 1e-4, 0, 1);
      }
      c.scheduler.warmupNumSteps = p.getInt("warmup_num_steps", 1000, 1, kBig);
      c.scheduler.warmupType = p.getEnum("warmup_type", "log", {"log", "linear"});
      p.finish();
    }
    s.finish();
  }
  {
    Section s = root.sub("bf16");
    c.bf16 = s.getBool("enabled", false);
    c.bf16OnlyIfFaster = s.getBool("only_if_faster", true);
    s.finish();
    Section h = root.sub("fp16");
    const bool fp16 = h.getBool("enabled", false);
    h.finish();
    LT_CHECK(!fp16, "config key 'fp16.enabled' = true: fp16 with loss scaling is not implemented in this CPU ",
             "build; use bf16.enabled (no loss scaling needed) or set it to false (fp32)");
  }
  {
    Section z = root.sub("zero_optimization");
    c.zero.stage = static_cast<int>(z.getInt("stage", 0, 0, 3));
    c.zero.subGroupSize = z.getInt("sub_group_size", 1000000000, 1, kBig);
    c.zero.reduceBucketSize = z.getInt("reduce_bucket_size", 500000000, 1, kBig);
    c.zero.allgatherBucketSize = z.getInt("allgather_bucket_size", 500000000, 1, kBig);
    c.zero.overlapComm = z.getBool("overlap_comm", true);
    // DeepSpeed's switches for paths longtrain always takes: accepted when they say so.
    for (const char* key : {"contiguous_gradients", "reduce_scatter"})
      LT_CHECK(z.getBool(key, true), "config key 'zero_optimization.", key, "' = false: longtrain always copies ",
               "gradients into contiguous buckets and reduce-scatters them (stages 1-3); remove the key or set it ",
               "to true");
    LT_CHECK(!z.getBool("round_robin_gradients", false), "config key 'zero_optimization.round_robin_gradients' = ",
             "true: not implemented (it balances CPU-offloaded gradient copies, which longtrain does not make); ",
             "remove the key or set it to false");
    c.zero.prefetchBucketSize = z.getInt("stage3_prefetch_bucket_size", 50000000, 0, kBig);
    c.zero.paramPersistenceThreshold = z.getInt("stage3_param_persistence_threshold", 100000, 0, kBig);
    c.zero.maxLiveParameters = z.getInt("stage3_max_live_parameters", 1000000000, 0, kBig);
    Section off = z.sub("offload_optimizer");
    c.zero.offloadOptimizer.device = off.getEnum("device", "none", {"none", "cpu"});
    c.zero.offloadOptimizer.superOffload = off.getBool("super_offload", false);
    c.zero.offloadOptimizer.ratio = off.getNum("ratio", 1.0, 0, 1);
    c.zero.offloadOptimizer.cpuadamCoresPerc = off.getNum("cpuadam_cores_perc", 0.8, 0, 1);
    off.finish();
    z.finish();
    const auto& off2 = c.zero.offloadOptimizer;
    LT_CHECK(off2.device == "none" || c.zero.stage >= 1, "config key 'zero_optimization.offload_optimizer.device' = \"",
             off2.device, "\" needs zero_optimization.stage 1, 2 or 3");
    LT_CHECK(!off2.superOffload || off2.device == "cpu", "config key 'zero_optimization.offload_optimizer.",
             "super_offload' = true needs offload_optimizer.device=\"cpu\"");
  }
  {
    Section cs = root.sub("compile");
    c.compile.deepcompile = cs.getBool("deepcompile", false);
    if (const json* sch = cs.find("schedule")) {
      c.compile.hasSchedule = true;
      LT_CHECK(sch->is_array(), "config key 'compile.schedule' must be a list of [step, [\"pass\", ...]] entries, got ",
               sch->dump());
      for (size_t i = 0; i < sch->size(); ++i) {
        const json& e = (*sch)[i];
        bool ok = e.is_array() && e.size() == 2 && e[0].is_number_integer() && e[1].is_array();
        if (ok)
          for (const auto& n : e[1]) ok &= n.is_string();
        LT_CHECK(ok, "config key 'compile.schedule[", i, "]' must be [step, [\"pass\", ...]] with an integer step, ",
                 "got ", e.dump());
        c.compile.schedule.push_back({e[0].get<int64_t>(), e[1].get<std::vector<std::string>>()});
      }
    }
    cs.finish();
  }
  c.model = parseModel(root.sub("model"));
  {
    Section d = root.sub("data");
    auto& dc = c.data;
    dc.type = d.getEnum("type", "kv_recall", {"kv_recall", "uint16", "uint32", "bytes"});
    dc.path = d.getString("path", "");
    dc.tokenizer = d.getString("tokenizer", "");
    dc.packing = d.getEnum("packing", "none", {"none", "documents"});
    dc.eosId = d.getInt("eos_id", -1, -1, kBig);
    dc.seqLen = d.getInt("seq_len", 256, 2, kBig);
    dc.numSamples = d.getInt("num_samples", 100000, 1, kBig);
    dc.evalSamples = d.getInt("eval_samples", 64, 0, kBig);
    dc.evalFraction = d.getNum("eval_fraction", 0, 0, 0.5);
    Section kv = d.sub("kv");
    dc.kvPairs = kv.getInt("num_pairs", 16, 1, kBig);
    dc.kvQueries = kv.getInt("num_queries", 32, 1, kBig);
    dc.kvKeys = kv.getInt("num_keys", 32, 1, kBig);
    dc.kvValues = kv.getInt("num_values", 16, 2, kBig);
    dc.kvNoise = kv.getInt("num_noise", 16, 1, kBig);
    dc.kvFused = kv.getBool("fused_pairs", false);
    kv.finish();
    d.finish();
    LT_CHECK(dc.type == "kv_recall" || !dc.path.empty(), "config key 'data.path' is required when data.type=\"",
             dc.type, "\" (a file of tokens)");
    LT_CHECK(dc.packing == "none" || dc.type != "kv_recall", "config key 'data.packing' = \"", dc.packing,
             "\" needs a token file (data.type uint16, uint32 or bytes): kv_recall samples are one document each");
    if (dc.tokenizer.empty() && !c.model.initFrom.empty() &&
        std::filesystem::is_regular_file(std::filesystem::path(c.model.initFrom) / "tokenizer.model"))
      dc.tokenizer = (std::filesystem::path(c.model.initFrom) / "tokenizer.model").string();
  }
  {
    Section t = root.sub("train");
    c.train.steps = t.getInt("steps", 100, 1, kBig);
    c.train.nproc = static_cast<int>(t.getInt("nproc", 1, 1, 1024));
    c.train.threads = static_cast<int>(t.getInt("threads", 0, 0, 4096));
    c.train.evalEvery = t.getInt("eval_every", 0, 0, kBig);
    c.train.sampleEvery = t.getInt("sample_every", 0, 0, kBig);
    c.train.sampleTokens = t.getInt("sample_tokens", 32, 1, 1 << 20);
    c.train.samplePrompt = t.getString("sample_prompt", "");
    c.train.commTimeoutS = t.getNum("comm_timeout_s", 60, 0.1, 1e6);
    c.train.memoryBudget = t.getBytes("memory_budget", 0);
    c.train.memoryPreflight = t.getBool("memory_preflight", true);
    {
      Section k = t.sub("checkpoint");
      c.train.checkpoint.dir = k.getString("dir", "");
      c.train.checkpoint.everySteps = k.getInt("every_steps", 0, 0, kBig);
      c.train.checkpoint.keepLast = k.getInt("keep_last", 0, 0, kBig);
      c.train.checkpoint.async = k.getBool("async", false);
      c.train.checkpoint.onError = k.getEnum("on_error", "stop", {"stop", "warn"});
      k.finish();
      LT_CHECK(c.train.checkpoint.everySteps == 0 || !c.train.checkpoint.dir.empty(),
               "config key 'train.checkpoint.every_steps' = ", c.train.checkpoint.everySteps,
               " needs 'train.checkpoint.dir' (where to write checkpoints)");
    }
    t.finish();
  }
  root.finish();
  resolveBatch(c, worldSize);
  checkProductsFit(c);
  c.spLayout = sp::chooseLayout(c.sequenceParallelSize, c.model.heads, c.model.kvHeads, c.sequenceParallelRingDegree,
                                c.sequenceParallelBalance);
  c.source = effectiveSource(j, c.model);
  return c;
}

void applyOverride(json& j, const std::string& assignment) {
  auto eq = assignment.find('=');
  LT_CHECK(eq != std::string::npos && eq > 0, "--set '", assignment, "' must look like KEY=VALUE, e.g. ",
           "--set zero_optimization.stage=3");
  std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
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
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
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
    (void)depth;
    return true;
  };
  (void)json::parse(in, cb, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  return duplicate;
}

}  // namespace

json loadConfigJson(const std::string& path, const std::vector<std::string>& overrides) {
  LT_CHECK(!std::filesystem::is_directory(path), "config file '", path, "' is a directory; give the JSON config ",
           "file itself (e.g. examples/quickstart.json)");
  std::ifstream f(path);
  LT_CHECK(f.good(), "cannot open config file '", path, "'");
  json j = json::parse(f, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  LT_CHECK(!j.is_discarded(), "config file '", path, "' is not valid JSON");
  std::ifstream again(path);
  const std::string dup = firstDuplicateKey(again);
  LT_CHECK(dup.empty(), "config file '", path, "': key '", dup, "' appears twice (JSON would silently keep the ",
           "last one); remove one of them");
  for (const auto& o : overrides) applyOverride(j, o);
  return j;
}

Config loadConfig(const std::string& path, const std::vector<std::string>& overrides, int worldSize) {
  return parseConfig(loadConfigJson(path, overrides), worldSize);
}

}  // namespace lt::train
