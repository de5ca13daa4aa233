// The model variants (Llama with head_dim, Qwen2, Qwen3, Mistral) against the independent forward
// of tests/fixtures/hf_models (make_hf_models.py): every attention core, SP 2 (Ulysses and ring),
// export -> init_from, greedy decoding through the KV cache; random init from the config keys,
// and their refusals. Non-obvious: the SP checks compare each rank's shard of the logits with
// the reference's columns at the shard's global token indices (sp::tokenIndex), so any layout.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "hf_testing.h"
#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/config/hf_llama_config.h"
#include "longtrain/model/generate.h"
#include "longtrain/sp/layout.h"
#include "longtrain/sp/ring_attention.h"
#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using lt::testing::errorOf;
using lt::testing::Tol;

const std::vector<std::string> kFixtures = {"llama_headdim", "qwen2_bias", "qwen3_qknorm_headdim",
                                            "qwen3_attention_bias", "mistral_window"};

fs::path fixture(const std::string& name) { return lt::testing::hfFixture("hf_models", name); }

class HfModels : public ::testing::TestWithParam<std::string> {};

// Tile 5: tiles that straddle the window's edges (W = 5 in mistral_window) and the sequence's end.
TEST_P(HfModels, LogitsAndLossMatchTheIndependentForwardInEveryCore) {
  lt::testing::checkHfOracle(fixture(GetParam()), 5);
}

// SP over 2 thread ranks with `ringDegree` (1: Ulysses 2; 2: ring 2): every rank's logits of its
// shard and the summed loss against the reference.
void checkSequenceParallel(const std::string& name, int ringDegree) {
  at::set_num_threads(1);
  const fs::path dir = fixture(name);
  const auto ref = lt::testing::readHfReference(dir);
  const auto mc = lt::config::readHfLlamaConfig(dir.string()).model;
  const auto layout = lt::config::ParallelLayout::make(2, 2, mc.heads, mc.kvHeads, ringDegree, lt::config::SpBalance::Contiguous);
  lt::data::Batch whole;
  whole.input_ids = ref.ids, whole.labels = ref.labels, whole.position_ids = ref.pos;
  lt::testing::runRanks(2, 2, [&](int r, lt::comm::Groups& g) {
    auto m = lt::ckpt::loadInferenceModel(dir.string(), "generate MODEL");
    auto attn = lt::sp::sequenceParallelAttention(g.spUlysses, g.spRing, layout, r, lt::model::attentionCore(mc), 3,
                                                  nullptr, mc.slidingWindow);
    const auto shard = lt::sp::shardBatch(whole, r, layout);
    at::NoGradGuard ng;
    auto logits = m.model->forward(shard.input_ids, shard.position_ids, attn);
    auto want = ref.logits.index_select(1, lt::sp::tokenIndex(layout, r, shard.input_ids.size(1)));
    const double maxDiff = (logits.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
    auto ls = lt::model::lossSum(logits, shard.shift_labels);
    auto sums = at::tensor({ls.sum.item<double>(), static_cast<double>(ls.count)}, at::kDouble);
    g.sp->allReduce(sums).wait();
    const double loss = sums[0].item<double>() / sums[1].item<double>();
    std::printf("[oracle sp2] %s %s rank %d: max |logit diff| %.3g, loss %.8f vs %.8f\n", name.c_str(),
                layout.describe().c_str(), r, maxDiff, loss, ref.loss);
    EXPECT_LE(maxDiff, Tol::kHfOracle) << name << " " << layout.describe();
    EXPECT_LE(std::abs(loss - ref.loss), Tol::kHfOracle) << name << " " << layout.describe();
  }, std::chrono::milliseconds(30000), layout.R);
}

TEST_P(HfModels, UlyssesTwoMatchesTheIndependentForward) { checkSequenceParallel(GetParam(), 1); }
TEST_P(HfModels, RingTwoMatchesTheIndependentForward) { checkSequenceParallel(GetParam(), 2); }

std::set<std::string> tensorNames(const fs::path& file) {
  std::set<std::string> out;
  lt::ckpt::SafetensorsFile f(file.string());
  for (const auto& e : f.header().tensors) out.insert(e.name);
  return out;
}

// Train two steps from the fixture, checkpoint, export: config.json names the type and its
// fields, the tensor names are the fixture's, and init_from of the export is the checkpoint.
TEST_P(HfModels, ExportRoundTripsTypeFieldsAndTensors) {
  at::set_num_threads(1);
  const fs::path dir = fixture(GetParam()), root = lt::testing::freshTempDir("longtrain_hf_models_" + GetParam());
  const lt::ckpt::Checkpoint c = lt::testing::trainTwoStepsAndSave(dir, root);
  const fs::path out = root / "hf";
  lt::ckpt::exportHfDirectory(c, out.string(), {});
  const json theirs = json::parse(std::ifstream(dir / "config.json")), ours = json::parse(std::ifstream(out / "config.json"));
  for (const char* key : {"model_type", "architectures", "head_dim", "sliding_window", "attention_bias",
                          "use_sliding_window", "tie_word_embeddings", "num_key_value_heads"})
    if (theirs.contains(key) && !(std::string(key) == "sliding_window" && GetParam() == "qwen2_bias")) {
      EXPECT_EQ(ours.value(key, json()), theirs[key]) << key;  // Qwen2's unused window is written as null
    }
  EXPECT_EQ(tensorNames(out / "model.safetensors"), tensorNames(dir / "model.safetensors"));
  const auto a = lt::config::readHfLlamaConfig(dir.string()).model, b = lt::config::readHfLlamaConfig(out.string()).model;
  EXPECT_EQ(a.modelType, b.modelType);
  EXPECT_EQ(a.headDim(), b.headDim());
  EXPECT_EQ(a.qkvBias(), b.qkvBias());
  EXPECT_EQ(a.oBias(), b.oBias());
  EXPECT_EQ(a.qkNorm, b.qkNorm);
  EXPECT_EQ(a.slidingWindow, b.slidingWindow);
  lt::testing::runRanks(1, 1, [&](int, lt::comm::Groups& g) {
    lt::train::Engine e(lt::config::parseConfig(lt::testing::initFromConfig(out), 1), g);
    auto params = e.fullParameters();
    ASSERT_EQ(params.size(), c.manifest().params.size());
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(at::equal(params[i], c.full(static_cast<int>(i)))) << c.manifest().params[i].name;
  });
}

// Greedy decoding with the KV cache (biases, q/k norms, the window over 17 tokens > W) picks the
// argmax of the training forward at every step.
TEST_P(HfModels, GreedyDecodingEqualsTheArgmaxOfTheTrainingForward) {
  at::set_num_threads(1);
  auto m = lt::ckpt::loadInferenceModel(fixture(GetParam()).string(), "generate MODEL");
  lt::testing::expectGreedyEqualsForwardArgmax(*m.model);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfModels, ::testing::ValuesIn(kFixtures));

// Random init from the config keys alone: SP 2 with ZeRO-3 trains as one rank does, and the
// checkpointed parameter names are Hugging Face's for the type.
TEST(HfModelKeys, RandomInitTrainsUnderSpAndZero3LikeOneRank) {
  at::set_num_threads(1);
  const std::vector<json> variants = {
      {{"model_type", "qwen2"}},
      {{"model_type", "qwen3"}, {"head_dim", 12}, {"attention_bias", true}},
      {{"model_type", "mistral"}, {"sliding_window", 7}},
      {{"model_type", "llama"}, {"head_dim", 6}},
  };
  for (const auto& v : variants) {
    json j = lt::testing::tinyTrainConfig();
    // Adam's eps at 1e-5 (UlyssesEngine.SpTimesDpEqualsOneRank explains 1e-6): on libtorch 2.6
    // the qwen3 variant's worst element after 2 steps differed by 3.8e-4 of its tensor's scale at
    // 1e-6. Measured by inverting Adam's first step (dp/lr = -g/(|g|+eps) - wd p): every worst
    // element had |g| of 1.1-5.2 eps, where g/(|g|+eps) turns a last-bit change of g (summation
    // order across ranks) into a visible step; elements with |g| >= 10 eps agreed to 9e-7, and the
    // losses to 2e-8. At 1e-5 the worst is 5.5e-5.
    j["optimizer"]["params"]["eps"] = 1e-5;
    j["model"].update(v);
    const auto one = lt::testing::trainOnRanks(j, 1, 1, 2);
    j["sequence_parallel_size"] = 2;
    j["zero_optimization"] = {{"stage", 3}};
    const auto two = lt::testing::trainOnRanks(j, 2, 2, 2);
    for (size_t s = 0; s < one[0].losses.size(); ++s)
      EXPECT_LE(std::abs(two[0].losses[s] - one[0].losses[s]) / one[0].losses[s], Tol::kSequenceParallel)
          << v.dump() << " step " << s;
    for (size_t i = 0; i < one[0].params.size(); ++i)
      EXPECT_LE(lt::testing::relErr(two[0].params[i], one[0].params[i]), Tol::kAfterAdamSteps) << v.dump() << " " << i;
    const auto cfg = lt::config::parseConfig(j, 2);
    lt::model::Model m(cfg.model, 0, false);
    EXPECT_EQ(m.parameters().size(), one[0].params.size());
    int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.numel();
    EXPECT_EQ(n, cfg.model.numParams()) << v.dump();
  }
}

// Biases and q/k norms never decay (like the other norms); matrices do: AdamW's first step with
// and without weight decay differs by exactly -lr * wd * p0 on matrices and not at all elsewhere.
TEST(HfModelKeys, BiasesAndQkNormsDoNotDecayUnderZero3) {
  at::set_num_threads(1);
  json j = lt::testing::initFromConfig(fixture("qwen3_attention_bias"));
  j["zero_optimization"] = {{"stage", 3}};
  j["optimizer"]["params"]["lr"] = 0.1;
  std::vector<lt::ckpt::ParamMeta> meta;
  std::vector<at::Tensor> p0, after[2];
  for (int decay = 0; decay < 2; ++decay) {
    j["optimizer"]["params"]["weight_decay"] = decay ? 0.5 : 0.0;
    const auto cfg = lt::config::parseConfig(j, 2);
    lt::testing::runRanks(2, 1, [&](int r, lt::comm::Groups& g) {
      lt::train::Engine e(cfg, g);
      auto before = e.fullParameters();
      e.step();
      auto now = e.fullParameters();
      if (r != 0) return;
      p0 = before, after[decay] = now, meta = e.parameterMeta();
    });
  }
  int biases = 0, qkNorms = 0;
  for (size_t i = 0; i < meta.size(); ++i) {
    const std::string& n = meta[i].name;
    biases += n.find("_proj.bias") != std::string::npos;
    qkNorms += n.find("_norm.weight") != std::string::npos && n.find("self_attn") != std::string::npos;
    if (p0[i].dim() >= 2 && n != "model.embed_tokens.weight")
      EXPECT_LE(lt::testing::relErr(after[1][i] - after[0][i], -0.1 * 0.5 * p0[i]), Tol::kDecayClosedForm) << n;
    else
      EXPECT_TRUE(at::equal(after[1][i], after[0][i])) << n << " must not decay";
  }
  EXPECT_EQ(biases, 2 * 4);  // q, k, v, o in both layers
  EXPECT_EQ(qkNorms, 2 * 2);
}

fs::path editedFixture(const std::string& name, const std::function<void(json&)>& edit) {
  auto d = lt::testing::freshTempDir("longtrain_hf_models_edit");
  for (const auto& f : fs::directory_iterator(fixture(name))) fs::copy_file(f.path(), d / f.path().filename());
  json c = json::parse(std::ifstream(d / "config.json"));
  edit(c);
  std::ofstream(d / "config.json") << c.dump();
  return d;
}

TEST(HfModelKeys, UnimplementedVariantsAreRefusedByName) {
  auto qwenWindow = editedFixture("qwen2_bias", [](json& c) { c["use_sliding_window"] = true; });
  EXPECT_NE(errorOf([&] { lt::config::readHfLlamaConfig(qwenWindow.string()); })
                .find("use_sliding_window = true is not implemented for qwen2"),
            std::string::npos);
  auto layers = editedFixture("qwen3_qknorm_headdim", [](json& c) {
    c["layer_types"] = {"full_attention", "sliding_attention"};
  });
  EXPECT_NE(errorOf([&] { lt::config::readHfLlamaConfig(layers.string()); })
                .find("layer_types holds \"sliding_attention\""),
            std::string::npos);
  auto gemma = editedFixture("qwen2_bias", [](json& c) { c["model_type"] = "gemma"; });
  EXPECT_NE(errorOf([&] { lt::config::readHfLlamaConfig(gemma.string()); }).find("model_type \"gemma\" is not supported"),
            std::string::npos);
  json j = lt::testing::tinyTrainConfig();
  j["model"]["qk_norm"] = true;
  EXPECT_NE(errorOf([&] { lt::config::parseConfig(j, 1); }).find("model.qk_norm=true"), std::string::npos);
  j = lt::testing::tinyTrainConfig();
  j["model"]["sliding_window"] = 4;
  EXPECT_NE(errorOf([&] { lt::config::parseConfig(j, 1); }).find("model.sliding_window=4 needs model.model_type"),
            std::string::npos);
  j = lt::testing::initFromConfig(fixture("mistral_window"));
  j["model"]["sliding_window"] = 6;
  const std::string e = errorOf([&] { lt::config::parseConfig(j, 1); });
  EXPECT_NE(e.find("disagrees with sliding_window = 5"), std::string::npos) << e;
}

}  // namespace
