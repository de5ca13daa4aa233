// Hugging Face Llama directories in and out. The oracle: committed fixtures (tests/fixtures/
// hf_llama, made by make_hf_llama.py with an independent PyTorch implementation of
// LlamaForCausalLM's forward) whose logits and loss longtrain must reproduce.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/ckpt/safetensors.h"
#include "longtrain/model/generate.h"
#include "longtrain/config/hf_llama_config.h"
#include "hf_testing.h"
#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using lt::testing::errorOf;

fs::path fixture(const std::string& name) { return lt::testing::hfFixture("hf_llama", name); }
using lt::testing::initFromConfig;

class HfOracle : public ::testing::TestWithParam<std::string> {};

// Through the engine (init_from, every attention core and both kernel paths): logits and the
// mean loss within 1e-5 of the independent implementation.
TEST_P(HfOracle, LogitsAndLossMatchTheIndependentForward) { lt::testing::checkHfOracle(fixture(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Fixtures, HfOracle, ::testing::Values("gqa_untied", "mha_tied", "gqa_sharded_bf16",
                                                                    "gqa_llama3_rope", "gqa_yarn_rope"));

TEST(HfLoad, ZeroThreeRanksReadOnlyTheirSlicesAndGatherTheFile) {
  const fs::path dir = fixture("gqa_untied");
  json j = initFromConfig(dir);
  j["zero_optimization"] = {{"stage", 3}};
  lt::ckpt::HfWeights w(dir.string(), "model.init_from");
  lt::testing::runRanks(2, 1, [&](int, lt::comm::Groups& g) {
    lt::train::Engine e(lt::config::parseConfig(j, 2), g);
    auto params = e.fullParameters();
    auto meta = e.parameterMeta();
    for (size_t i = 0; i < params.size(); ++i) {
      auto expect = at::empty({params[i].numel()}, at::kFloat);
      w.read(meta[i].name, 0, expect);
      EXPECT_TRUE(at::equal(params[i].reshape({-1}), expect)) << meta[i].name;
    }
  });
}

// llama3 scaling is read, recorded in the checkpoint's config and written back on export; a
// model section's rope_theta and rope_scaling override init_from's (context extension).
TEST(HfLoad, RopeScalingTravelsThroughTheConfigAndExport) {
  json j = initFromConfig(fixture("gqa_llama3_rope"));
  const auto cfg = lt::config::parseConfig(j, 1);
  EXPECT_EQ(cfg.model.ropeScaling.type, lt::config::RopeType::Llama3);
  EXPECT_EQ(cfg.model.ropeScaling.originalMaxPositions, 64);
  EXPECT_EQ(json::parse(cfg.source)["model"]["rope_scaling"]["rope_type"], "llama3");
  j["model"]["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
  j["model"]["rope_theta"] = 40000.0;
  const auto extended = lt::config::parseConfig(j, 1);
  EXPECT_EQ(extended.model.ropeScaling.type, lt::config::RopeType::Yarn);
  EXPECT_EQ(extended.model.ropeTheta, 40000.0);
  EXPECT_EQ(extended.model.hidden, 32);  // the rest still from config.json
}

TEST(HfLoad, AKeyGivenInBothThatDisagreesNamesBothValues) {
  json j = initFromConfig(fixture("gqa_untied"));
  j["model"]["hidden_size"] = 16;
  const std::string e = errorOf([&] { lt::config::parseConfig(j, 1); });
  EXPECT_NE(e.find("model.hidden_size' = 16"), std::string::npos) << e;
  EXPECT_NE(e.find("hidden_size = 32"), std::string::npos) << e;
  j["model"]["hidden_size"] = 32;  // agreeing is fine
  EXPECT_EQ(errorOf([&] { lt::config::parseConfig(j, 1); }), "");
  EXPECT_EQ(lt::config::parseConfig(j, 1).model.kvHeads, 2);  // the rest from config.json
}

fs::path copyFixture(const std::string& name, const std::string& to) {
  auto d = lt::testing::freshTempDir(to);
  for (const auto& f : fs::directory_iterator(fixture(name))) fs::copy_file(f.path(), d / f.path().filename());
  return d;
}

TEST(HfLoad, UnimplementedRopeScalingIsRefusedByName) {
  auto d = copyFixture("gqa_untied", "longtrain_hf_rope");
  json c = json::parse(std::ifstream(d / "config.json"));
  c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 8.0}};
  std::ofstream(d / "config.json") << c.dump();
  std::string e = errorOf([&] { lt::config::readHfLlamaConfig(d.string()); });
  EXPECT_NE(e.find("rope_scaling type \"longrope\" is not implemented"), std::string::npos) << e;
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}};  // yarn without its original context
  std::ofstream(d / "config.json") << c.dump();
  e = errorOf([&] { lt::config::readHfLlamaConfig(d.string()); });
  EXPECT_NE(e.find("\"yarn\" needs original_max_position_embeddings"), std::string::npos) << e;
}

TEST(HfLoad, MissingUnexpectedAndMisShapedTensorsAreListedByName) {
  auto d = copyFixture("gqa_untied", "longtrain_hf_bad");
  std::vector<lt::ckpt::NamedTensor> ts;
  {
    lt::ckpt::SafetensorsFile f((d / "model.safetensors").string());
    for (const auto& e : f.header().tensors) {
      if (e.name == "model.norm.weight") continue;
      auto t = f.view(e.name).clone();
      if (e.name == "model.layers.0.self_attn.q_proj.weight") t = t.narrow(0, 0, 8).contiguous();
      ts.push_back({e.name, t});
    }
  }
  ts.push_back({"model.layers.0.self_attn.q_norm.weight", at::ones({8})});
  lt::ckpt::writeSafetensors((d / "model.safetensors").string(), ts, {{"format", "pt"}});
  const std::string e = errorOf([&] {
    lt::testing::runRanks(1, 1, [&](int, lt::comm::Groups& g) {
      lt::train::Engine eng(lt::config::parseConfig(initFromConfig(d), 1), g);
    });
  });
  EXPECT_NE(e.find("missing: model.norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected: model.layers.0.self_attn.q_norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers.0.self_attn.q_proj.weight (F32 [8, 32], expected F32/BF16/F16 [32, 32])"),
            std::string::npos)
      << e;
}

// Train from a fixture, checkpoint, export: init_from of the export reproduces the checkpoint's
// model exactly (fp32), or rounded to bf16 with --dtype bf16.
TEST(HfExport, InitFromTheExportReproducesTheModel) {
  auto root = lt::testing::freshTempDir("longtrain_hf_export");
  const lt::ckpt::Checkpoint c = lt::testing::trainTwoStepsAndSave(fixture("gqa_untied"), root);
  for (const std::string dtype : {"fp32", "bf16"}) {
    const fs::path out = root / ("hf_" + dtype);
    lt::ckpt::HfExportOptions o;
    o.dtype = dtype;
    lt::ckpt::exportHfDirectory(c, out.string(), o);
    json cj = json::parse(std::ifstream(out / "config.json"));
    EXPECT_EQ(cj["architectures"], json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(cj["model_type"], "llama");
    EXPECT_EQ(cj["torch_dtype"], dtype == "bf16" ? "bfloat16" : "float32");
    EXPECT_EQ(cj["num_key_value_heads"], 2);
    EXPECT_EQ(cj["tie_word_embeddings"], false);
    lt::testing::runRanks(1, 1, [&](int, lt::comm::Groups& g) {
      json again = initFromConfig(out);
      lt::train::Engine e(lt::config::parseConfig(again, 1), g);
      auto params = e.fullParameters();
      for (size_t i = 0; i < params.size(); ++i) {
        auto want = c.full(static_cast<int>(i));
        if (dtype == "bf16") want = want.to(at::kBFloat16).to(at::kFloat);
        EXPECT_TRUE(at::equal(params[i], want)) << dtype << " " << c.manifest().params[i].name;
      }
    });
  }
}

// Context extension: a model section's rope_theta and YaRN over init_from train, and export
// writes what was used (with max_position_embeddings at least the trained length), so that
// reading the export back gives the same RoPE.
TEST(HfExport, ContextExtensionIsWhatExportWrites) {
  auto root = lt::testing::freshTempDir("longtrain_hf_extend");
  json j = initFromConfig(fixture("gqa_untied"));
  j["model"]["rope_theta"] = 40000.0;
  j["model"]["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64},
                                {"beta_fast", 16.0}};
  j["data"]["seq_len"] = 80;
  j["train"]["checkpoint"] = {{"dir", (root / "ckpt").string()}};
  lt::testing::runRanks(1, 1, [&](int, lt::comm::Groups& g) {
    lt::train::Engine e(lt::config::parseConfig(j, 1), g);
    e.step();
    lt::ckpt::save(e, (root / "ckpt").string(), 0);
  });
  lt::ckpt::Checkpoint c(lt::ckpt::resolve((root / "ckpt").string(), "--resume"));
  lt::ckpt::exportHfDirectory(c, (root / "hf").string(), {});
  const json cj = json::parse(std::ifstream(root / "hf" / "config.json"));
  EXPECT_EQ(cj["rope_theta"], 40000.0);
  EXPECT_EQ(cj["rope_scaling"]["rope_type"], "yarn");
  EXPECT_EQ(cj["rope_scaling"]["factor"], 4.0);
  EXPECT_EQ(cj["rope_scaling"]["original_max_position_embeddings"], 64);
  EXPECT_EQ(cj["rope_scaling"]["beta_fast"], 16.0);
  EXPECT_GE(cj["max_position_embeddings"].get<int64_t>(), 80);
  const auto back = lt::config::readHfLlamaConfig((root / "hf").string()).model;
  EXPECT_EQ(back.ropeTheta, 40000.0);
  EXPECT_EQ(back.ropeScaling.betaFast, 16.0);
  EXPECT_NEAR(back.ropeScaling.attentionScale(), 1 + 0.1 * std::log(4.0), 1e-15);
}

// Greedy decoding with the KV cache picks, at every step, the argmax of the training forward
// over the prompt and the tokens generated so far.
TEST(Generate, GreedyEqualsTheArgmaxOfTheTrainingForward) {
  at::set_num_threads(1);
  auto m = lt::ckpt::loadInferenceModel(fixture("gqa_untied").string(), "generate MODEL");
  lt::testing::expectGreedyEqualsForwardArgmax(*m.model);
  const std::vector<int64_t> prompt = {1, 7, 3, 22, 9};
  lt::model::SamplingOptions o;
  o.maxNewTokens = 12;
  // Sampling is seeded: the same seed, the same tokens; another seed, (almost surely) others.
  o.temperature = 1.0;
  o.topK = 10;
  EXPECT_EQ(lt::model::generate(*m.model, prompt, o), lt::model::generate(*m.model, prompt, o));
}

TEST(Generate, CommandLinePrintsTokenIdsFromAHuggingFaceDirectory) {
  auto r = lt::testing::runCommand(std::string(LONGTRAIN_BIN) + " generate " + fixture("mha_tied").string() +
                                   " --prompt-ids 1,5,7 --max-new-tokens 6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("6 tokens in"), std::string::npos) << r.out;
  auto bad = lt::testing::runCommand(std::string(LONGTRAIN_BIN) + " generate " + fixture("mha_tied").string() +
                                     " --prompt hello");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("--prompt needs a tokenizer"), std::string::npos) << bad.out;
}

}  // namespace
