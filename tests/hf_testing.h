// Helpers of the Hugging Face fixture tests (hf_test.cpp: Llama; hf_models_test.cpp: the
// variants): the fixture directories, a one-step training config over one, its reference.
// Non-obvious: the config's kv_recall task fits the smallest fixture vocabulary (24).
#pragma once
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/ckpt/safetensors.h"
#include "longtrain/model/generate.h"
#include "testing.h"

namespace lt::testing {

// tests/fixtures/<set>/<name>; set "hf_llama" (make_hf_llama.py) or "hf_models" (make_hf_models.py).
inline std::filesystem::path hfFixture(const std::string& set, const std::string& name) {
  return std::filesystem::path(LONGTRAIN_SOURCE_DIR) / "tests/fixtures" / set / name;
}

// A one-step training config over an init_from directory.
inline nlohmann::json initFromConfig(const std::filesystem::path& dir) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "data": {"seq_len": 12, "num_samples": 64, "eval_samples": 0,
             "kv": {"num_pairs": 2, "num_queries": 2, "num_keys": 4, "num_values": 4, "num_noise": 4}},
    "train": {"steps": 2}
  })");
  j["model"] = {{"init_from", dir.string()}};
  return j;
}

// reference.safetensors: the inputs and the independent forward's logits and mean loss.
struct HfReference {
  at::Tensor ids, labels, pos, logits;
  double loss;
};
inline HfReference readHfReference(const std::filesystem::path& dir) {
  ckpt::SafetensorsFile f((dir / "reference.safetensors").string());
  return {f.view("input_ids").clone(), f.view("labels").clone(), f.view("position_ids").clone(),
          f.view("logits").clone(), f.view("loss").to(at::kDouble).sum().item<double>()};
}

// Through the engine (init_from, every attention core and both kernel paths): logits and the
// mean loss within Tol::kHfOracle of the independent implementation. chunk > 0: the chunked and
// fused cores' tile edge (model.attention_chunk).
inline void checkHfOracle(const std::filesystem::path& dir, int64_t chunk = 0) {
  at::set_num_threads(1);
  const HfReference ref = readHfReference(dir);
  const std::string name = dir.filename().string();
  for (const auto& [attention, fused] : {std::pair{"fused", true}, {"chunked", true}, {"naive", false}}) {
    nlohmann::json j = initFromConfig(dir);
    j["model"]["attention"] = attention;
    j["model"]["fused_kernels"] = fused;
    if (chunk > 0) j["model"]["attention_chunk"] = chunk;
    runRanks(1, 1, [&](int, comm::Groups& g) {
      train::Engine e(config::parseConfig(j, 1), g);
      at::NoGradGuard ng;
      auto logits = e.model().forward(ref.ids, ref.pos, model::attentionCore(e.config().model));
      const double maxDiff = (logits.to(at::kDouble) - ref.logits.to(at::kDouble)).abs().max().item<double>();
      auto ls = model::lossSum(logits, data::shiftLabels(ref.labels));
      const double loss = ls.sum.item<double>() / static_cast<double>(ls.count);
      std::printf("[oracle] %s %s fused_kernels=%d: max |logit diff| %.3g (max |logit| %.3g), loss %.8f vs %.8f\n",
                  name.c_str(), attention, fused, maxDiff, ref.logits.abs().max().item<double>(), loss, ref.loss);
      EXPECT_LE(maxDiff, Tol::kHfOracle) << name << " " << attention;
      EXPECT_LE(std::abs(loss - ref.loss), Tol::kHfOracle) << name << " " << attention;
    });
  }
}

// Two training steps from an init_from directory, saved to root/ckpt: that checkpoint.
inline ckpt::Checkpoint trainTwoStepsAndSave(const std::filesystem::path& dir, const std::filesystem::path& root) {
  nlohmann::json j = initFromConfig(dir);
  j["train"]["checkpoint"] = {{"dir", (root / "ckpt").string()}};
  runRanks(1, 1, [&](int, comm::Groups& g) {
    train::Engine e(config::parseConfig(j, 1), g);
    e.step();
    e.step();
    ckpt::save(e, (root / "ckpt").string(), 0);
  });
  return ckpt::Checkpoint(ckpt::resolve((root / "ckpt").string(), "--resume"));
}

// Greedy decoding of 12 tokens after a 5-token prompt with the KV cache picks, at every step, the
// argmax of the training forward over the prompt and the tokens generated so far.
inline void expectGreedyEqualsForwardArgmax(model::Model& m) {
  const std::vector<int64_t> prompt = {1, 7, 3, 22, 9};
  model::SamplingOptions o;
  o.maxNewTokens = 12;
  const auto out = model::generate(m, prompt, o);
  ASSERT_EQ(out.size(), 12u);
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  auto ids = at::tensor(all, at::kLong).unsqueeze(0);
  auto pos = at::arange(ids.size(1), at::kLong).unsqueeze(0);
  at::NoGradGuard ng;
  auto argmax = m.forward(ids, pos, model::attentionCore(m.config())).argmax(-1)[0];
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(argmax[prompt.size() - 1 + i].item<int64_t>(), out[i]) << "generated token " << i;
}

}  // namespace lt::testing
