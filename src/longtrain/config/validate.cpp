// validate(): one function per concern (batch, model shape, ZeRO, compile schedule, data,
// training), each naming the keys involved and how to fix them. Non-obvious: overflow is
// checked on the products the engine and the memory model form, not just per key.
#include "longtrain/config/validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <iterator>
#include <utility>
#include <vector>

#include "longtrain/config/problems.h"
#include "longtrain/config/token_sidecar.h"
#include "longtrain/core/check.h"

namespace lt::config {

namespace {

// DeepSpeed's rules: train_batch_size = micro x accumulation x data-parallel size; any two of
// the three determine the third, one alone means no accumulation.
void resolveBatch(Config& c) {
  const int64_t dp = c.layout.dp;
  int64_t tb = c.trainBatchSize, mb = c.microBatch, ga = c.gradAccum;
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
    ga = 1;
    tb = mb * dp;
  } else {
    LT_CHECK(false, "set train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed's batch keys)");
  }
  LT_CHECK(mb > 0 && ga > 0 && tb == mb * ga * dp, "inconsistent batch sizes: train_batch_size=", tb,
           " must equal train_micro_batch_size_per_gpu=", mb, " x gradient_accumulation_steps=", ga,
           " x data-parallel size=", dp, " (world ", c.layout.world, " / sequence_parallel_size ", c.layout.P,
           ") = ", mb * ga * dp, "; fix one of the three keys or the number of ranks");
  c.trainBatchSize = tb;
  c.microBatch = mb;
  c.gradAccum = ga;
}

// Each variant switch only where Hugging Face's class of model.model_type has it, so that every
// model trained can be exported as that type.
void checkVariant(const ModelConfig& m) {
  LT_CHECK(m.qkNorm == (m.modelType == ModelType::Qwen3), "model.qk_norm=", m.qkNorm ? "true" : "false",
           " with model.model_type=\"", m.modelType, "\": Qwen3 (and only Qwen3) has q/k norms; set model_type ",
           "\"qwen3\" or remove qk_norm");
  LT_CHECK(m.slidingWindow == 0 || m.modelType == ModelType::Mistral, "model.sliding_window=", m.slidingWindow,
           " needs model.model_type=\"mistral\" (", m.modelType, "'s sliding window, where it has one, covers ",
           "only some layers, which is not implemented)");
  LT_CHECK(!m.attentionBias || m.modelType == ModelType::Llama || m.modelType == ModelType::Qwen3, "model.attention_bias=true with ",
           "model.model_type=\"", m.modelType, "\": ",
           m.modelType == ModelType::Qwen2 ? "Qwen2 always has q/k/v biases and no o_proj bias; remove the key"
                                  : "Mistral has no biases; remove the key");
}

void checkModel(const ModelConfig& m) {
  LT_CHECK(m.headDimension > 0 || m.hidden % m.heads == 0, "model.hidden_size=", m.hidden,
           " must be divisible by model.num_heads=", m.heads, ", or model.head_dim given");
  LT_CHECK(m.heads % m.kvHeads == 0, "model.num_heads=", m.heads, " must be divisible by model.num_kv_heads=",
           m.kvHeads);
  LT_CHECK(m.headDim() % 2 == 0, "model.head_dim (hidden_size / num_heads unless given) = ", m.headDim(),
           " must be even (RoPE rotates pairs)");
  checkVariant(m);
}

void checkZero(const Config& c) {
  const ZeroConfig& z = c.zero;
  LT_CHECK(c.precision.communication == CommDtype::Fp32 || z.stage >= 1, "config key 'communication_data_type' = \"",
           c.precision.communication, "\" applies to ZeRO's gradient reduce-scatters (zero_optimization.stage 1, 2 ",
           "or 3); stage 0 all-reduces in fp32: raise the stage or remove the key");
  const auto& off = z.offloadOptimizer;
  LT_CHECK(!off.superOffload || off.device == OffloadDevice::Cpu, "config key 'zero_optimization.offload_optimizer.",
           "super_offload' = true needs offload_optimizer.device=\"cpu\"");
}

// With ZeRO-3 every schedule entry gathers parameters (the zero3 pass); without it none may.
// offload_activations needs the file's directory.
void checkSchedule(const Config& c) {
  if (!c.compile.schedule) return;
  const bool z3 = c.zero.stage == 3;
  for (const auto& e : *c.compile.schedule) {
    const bool has = std::find(e.passes.begin(), e.passes.end(), "zero3") != e.passes.end();
    LT_CHECK(has == z3, "compile.schedule: step ", e.step, ": ",
             z3 ? "zero_optimization.stage=3 needs the 'zero3' pass in every entry"
                : "the 'zero3' pass needs zero_optimization.stage=3");
    const bool off = std::find(e.passes.begin(), e.passes.end(), "offload_activations") != e.passes.end();
    LT_CHECK(!off || !c.train.offloadDir.empty(), "compile.schedule: step ", e.step,
             ": the 'offload_activations' pass needs train.offload_dir (the directory its file goes in); set it, ",
             "which also applies the pass to every entry");
  }
}

void checkData(const Config& c) {
  const DataConfig& d = c.data;
  LT_CHECK(!d.tokenFile() || !d.path.empty(), "config key 'data.path' is required when data.type=\"", d.type,
           "\" (a file of tokens)");
  LT_CHECK(d.packing == Packing::None || d.tokenFile(), "config key 'data.packing' = \"", d.packing,
           "\" needs a token file (data.type uint16, uint32 or bytes): kv_recall samples are one document each");
  LT_CHECK(d.packing == Packing::None || d.eosId >= 0 || !d.tokenizer.empty(), "data.packing=\"documents\" needs the EOS id ",
           "that separates documents: set data.tokenizer (its EOS is taken) or data.eos_id, or write the token file ",
           "with longtrain tokenize, whose sidecar (data.path + \".json\") names it");
  LT_CHECK(d.type != DataType::Bytes || c.model.vocabSize >= 256, "data.type=\"bytes\" needs model.vocab_size >= 256, got ",
           c.model.vocabSize);
  LT_CHECK(d.tokenFile() || kvRecallVocabNeeded(d) <= c.model.vocabSize, "model.vocab_size=", c.model.vocabSize,
           " is smaller than the kv_recall task needs (", kvRecallVocabNeeded(d), " = 2 + num_keys + num_values + ",
           "num_noise [+ num_keys x num_values if fused_pairs]); raise model.vocab_size");
  if (!d.tokenFile()) checkKvRecall(d.seqLen, d.kvPairs, d.kvQueries, d.kvKeys, d.kvValues, d.kvNoise);
}

// train.eval: the token file is there, and its dtype (and, to pack, its EOS) is known.
void checkLongEval(const Config& c) {
  const auto& e = c.train.longEval;
  if (e.data.empty()) return;
  std::error_code ec;
  LT_CHECK(std::filesystem::is_regular_file(e.data, ec), "config key 'train.eval.data' = '", e.data,
           "' is not a file (absolute: '", std::filesystem::absolute(e.data, ec).string(), "'); give a token file ",
           "written by longtrain tokenize");
  LT_CHECK(e.seqLen >= 2, "config key 'train.eval.seq_len' is required with train.eval.data (the window length)");
  const auto side = readTokenSidecar(e.data);
  LT_CHECK(e.dtype != TokenDtype::FromSidecar || side, "train.eval.data '", e.data, "' has no sidecar (", tokenSidecarPath(e.data),
           "); set train.eval.dtype (uint16 or uint32), or write the file with longtrain tokenize");
  LT_CHECK(e.packing == Packing::None || (side && side->eosId >= 0) || c.data.eosId >= 0, "train.eval.packing ",
           "\"documents\" needs the EOS id: from the file's sidecar, or data.eos_id");
}

void checkTrain(const Config& c) {
  checkLongEval(c);
  const TrainSection& t = c.train;
  LT_CHECK(t.checkpoint.everySteps == 0 || !t.checkpoint.dir.empty(), "config key 'train.checkpoint.every_steps' = ",
           t.checkpoint.everySteps, " needs 'train.checkpoint.dir' (where to write checkpoints)");
  LT_CHECK(t.samplePrompt.empty() || !c.data.tokenizer.empty(), "train.sample_prompt needs data.tokenizer to ",
           "encode it");
}

// Sizes the engine and the memory model multiply together must not overflow 64-bit
// arithmetic (each key alone is range-checked; their products are not): refused naming the keys.
void checkProductsFit(const Config& c) {
  struct Product {
    const char* what;
    std::vector<std::pair<const char*, int64_t>> factors;
  };
  const int64_t widest = std::max({c.model.hidden, c.model.intermediate, c.model.vocabSize});
  std::vector<Product> all = {
      {"activation elements of one micro-batch",
       {{"data.seq_len", c.data.seqLen}, {"train_micro_batch_size_per_gpu", c.microBatch},
        {"the widest of model.hidden_size, intermediate_size, vocab_size", widest}, {"model.num_layers", c.model.layers}}},
      {"weights of one layer", {{"model.hidden_size", c.model.hidden}, {"model.intermediate_size", c.model.intermediate},
                                {"model.num_layers", c.model.layers}}},
      {"attention weights of the layers", {{"model.hidden_size", c.model.hidden},
                                           {"model.num_heads x head_dim", c.model.qDim()},
                                           {"model.num_layers", c.model.layers}}},
      {"embedding weights", {{"model.vocab_size", c.model.vocabSize}, {"model.hidden_size", c.model.hidden}}}};
  // Only naive attention holds a micro-batch's scores at once; fused and chunked attention tile them.
  if (c.model.attention == AttentionKernel::Naive)
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

}  // namespace

void checkKvRecall(int64_t seqLen, int64_t pairs, int64_t queries, int64_t keys, int64_t values, int64_t noise) {
  LT_CHECK(pairs >= 1 && pairs <= keys, "data.kv.num_pairs=", pairs, " must be in [1, data.kv.num_keys=", keys,
           "] (keys in one sample are distinct)");
  const int64_t need = 1 + 2 * pairs + 2 * queries;
  LT_CHECK(seqLen >= need, "data.seq_len=", seqLen, " is too short for ", pairs, " pairs and ", queries,
           " queries (needs at least ", need, "); raise data.seq_len or lower data.kv.*");
  LT_CHECK(values >= 2 && noise >= 1 && queries >= 1,
           "data.kv: num_values must be >= 2, num_noise >= 1 and num_queries >= 1");
}

int64_t kvRecallVocabNeeded(const DataConfig& d) {
  return 2 + d.kvKeys + d.kvValues + d.kvNoise + (d.kvFused ? d.kvKeys * d.kvValues : 0);
}

// The kv heads each Ulysses rank holds after the all-to-all (replicated when fewer than U).
static int64_t ulyssesLocalKvHeads(const Config& c, const ParallelLayout& layout) {
  return std::max<int64_t>(c.model.kvHeads / layout.U, 1);
}

int ulyssesHeadGroups(const Config& c, const ParallelLayout& layout) {
  if (!layout.ulyssesOnly() || layout.U == 1 || c.model.attention != AttentionKernel::Fused) return 1;
  if (c.sequenceParallelUlyssesHeadGroups > 0) return c.sequenceParallelUlyssesHeadGroups;
  return ulyssesLocalKvHeads(c, layout) % 2 == 0 ? 2 : 1;
}

static void checkUlyssesHeadGroups(const Config& c) {
  const int asked = c.sequenceParallelUlyssesHeadGroups;
  if (asked <= 1 || !c.layout.ulyssesOnly() || c.layout.U == 1) return;
  const int64_t kv = ulyssesLocalKvHeads(c, c.layout);
  LT_CHECK(kv % asked == 0, "sequence_parallel_ulysses_head_groups=", asked, " does not divide the ", kv,
           " kv heads each Ulysses rank holds (model.num_kv_heads=", c.model.kvHeads, " over ", c.layout.U,
           " ranks; groups are cut on kv-head boundaries); choose a divisor of ", kv, ", or \"auto\"");
}

ParallelLayout layoutOf(const Config& c, int world) {
  return ParallelLayout::make(world, c.sequenceParallelSize, c.model.heads, c.model.kvHeads,
                              c.sequenceParallelRingDegree, c.sequenceParallelBalance);
}

void validate(Config& c, int world) {
  Problems problems;  // every concern's first problem, reported together
  problems.attempt([&] { checkModel(c.model); });
  const bool laidOut = problems.attempt([&] {
    c.layout = layoutOf(c, world);
    resolveBatch(c);
  });
  if (laidOut) problems.attempt([&] { checkUlyssesHeadGroups(c); });
  problems.attempt([&] { checkZero(c); });
  problems.attempt([&] { checkSchedule(c); });
  problems.attempt([&] { checkData(c); });
  problems.attempt([&] { checkTrain(c); });
  if (laidOut) problems.attempt([&] { checkProductsFit(c); });  // it multiplies the resolved batch
  problems.throwIfAny();
}

}  // namespace lt::config
