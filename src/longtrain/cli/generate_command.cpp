// `longtrain generate`: text from a checkpoint or a Hugging Face directory, through the KV
// cache, printed as it comes. Non-obvious: a text prompt gets the start token the model was
// trained after (EOS for packed documents, else BOS); a prompt given as ids is taken as it is.
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "longtrain/cli/command.h"
#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/core/check.h"
#include "longtrain/core/number_list.h"
#include "longtrain/data/text.h"
#include "longtrain/model/generate.h"

namespace lt::cli {

namespace {

struct GenerateFlags {
  std::string source, prompt, promptIds, tokenizer;
  model::SamplingOptions sampling;
  bool ignoreEos = false;
};

std::string describeSampling(const model::SamplingOptions& s) {
  if (s.temperature <= 0) return "greedy";
  return fmt::format("temperature {}{}, seed {}", s.temperature, s.topK > 0 ? fmt::format(", top-k {}", s.topK) : "",
                     s.seed);
}

std::vector<int64_t> promptIds(const GenerateFlags& f, const data::Tokenizer* tok, bool afterEos) {
  LT_CHECK(f.prompt.empty() || tok, "--prompt needs a tokenizer: ", f.source, " names none; give --tokenizer ",
           "(a tokenizer.json, a tokenizer.model or a model directory), or the prompt as token ids with --prompt-ids");
  LT_CHECK(f.prompt.empty() != f.promptIds.empty(), "give the prompt as text (--prompt) or as ids (--prompt-ids)");
  if (!f.promptIds.empty()) return parseNumberList<int64_t>(f.promptIds, "--prompt-ids", "1,15,27");
  std::vector<int64_t> ids = tok->encode(f.prompt);
  const int64_t start = afterEos ? tok->eosId() : tok->bosId();
  if (start >= 0) ids.insert(ids.begin(), start);
  return ids;
}

int runGenerate(GenerateFlags f) {
  at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  auto m = ckpt::loadInferenceModel(f.source, "generate MODEL");
  const std::string tokPath = f.tokenizer.empty() ? m.tokenizer : f.tokenizer;
  std::unique_ptr<data::Tokenizer> tok;
  if (!tokPath.empty()) tok = std::make_unique<data::Tokenizer>(tokPath);
  const std::vector<int64_t> prompt = promptIds(f, tok.get(), m.promptAfterEos);
  LT_CHECK(!tok || tok->vocabSize() <= m.model->config().vocabSize, "the tokenizer '", tokPath, "' has ",
           tok ? tok->vocabSize() : 0, " tokens, the model only ", m.model->config().vocabSize,
           ": they do not belong together");
  if (tok && !f.ignoreEos) f.sampling.stopToken = tok->eosId();
  std::fprintf(stderr, "generate: %s, %.2fM parameters, %zu prompt tokens, %s\n", m.describe.c_str(),
               m.model->config().numParams() / 1e6, prompt.size(), describeSampling(f.sampling).c_str());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> out;
  if (tok) {
    data::TextStream ts(*tok, prompt);
    out = model::generate(*m.model, prompt, f.sampling, [&](int64_t id) { ts.add(id); });
  } else {
    out = model::generate(*m.model, prompt, f.sampling, [](int64_t id) {
      std::printf("%lld ", (long long)id);
      std::fflush(stdout);
    });
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n");
  std::fprintf(stderr, "generate: %zu tokens in %.2f s (%.1f tokens/s)\n", out.size(), s, out.size() / std::max(s, 1e-9));
  return 0;
}

}  // namespace

Command generateCommand(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  auto* gen = app.add_subcommand("generate", "generate text from a checkpoint or a Hugging Face directory "
                                            "(KV cache; tokens printed as they come)");
  gen->add_option("MODEL", f->source, "a checkpoint (step directory or root) or a Hugging Face model directory")
      ->required();
  gen->add_option("--prompt", f->prompt, "the prompt text (tokenized with the model's tokenizer)");
  gen->add_option("--prompt-ids", f->promptIds, "the prompt as comma-separated token ids (no tokenizer needed)");
  gen->add_option("--tokenizer", f->tokenizer, "a tokenizer.json, a SentencePiece .model, or a directory holding one "
                                               "(default: the model directory's, or the run's data.tokenizer)");
  gen->add_option("--max-new-tokens", f->sampling.maxNewTokens, "tokens to generate (default 64)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  gen->add_option("--temperature", f->sampling.temperature, "sampling temperature; 0 (default): greedy")
      ->check(CLI::Range(0.0, 100.0));
  gen->add_option("--top-k", f->sampling.topK, "sample among the K most likely tokens (default: all)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  gen->add_option("--seed", f->sampling.seed, "seed of the sampling generator (default 1234)");
  gen->add_flag("--ignore-eos", f->ignoreEos, "keep generating after the tokenizer's EOS");
  return {gen, [f] { return runGenerate(*f); }};
}

}  // namespace lt::cli
