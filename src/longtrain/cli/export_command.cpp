// `longtrain export`: a checkpoint's model as a Hugging Face directory (config.json,
// model.safetensors, the run's tokenizer files) or as one .safetensors file. Non-obvious: the
// tokenizer files are found from the run's own config (data.tokenizer, the token file's
// sidecar, model.init_from's directory), so an exported directory loads with its tokenizer.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "longtrain/cli/command.h"
#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/config/token_sidecar.h"
#include "longtrain/core/check.h"
#include "longtrain/data/tokenizer.h"

namespace lt::cli {

namespace {

namespace fs = std::filesystem;
using TokenizerFile = ckpt::HfExportOptions::TokenizerFile;

struct ExportFlags {
  std::string ckpt, out, dtype = "fp32";
};

// data.tokenizer, else the one data.path's sidecar records; "" when the run had none.
std::string runTokenizer(const nlohmann::json& cfg) {
  if (!cfg.contains("data") || !cfg["data"].is_object()) return "";
  std::string given = cfg["data"].value("tokenizer", "");
  if (const auto s = config::readTokenSidecar(cfg["data"].value("path", "")); given.empty() && s) given = s->tokenizer;
  return given;
}

// The tokenizer files a run had, under their standard names: data.tokenizer's (with the
// tokenizer_config.json beside a tokenizer.json), then those beside model.init_from's weights.
std::vector<TokenizerFile> runTokenizerFiles(const nlohmann::json& cfg) {
  std::vector<TokenizerFile> out;
  const auto add = [&](const fs::path& src, const std::string& name) {
    const bool taken = std::any_of(out.begin(), out.end(), [&](const auto& o) { return o.name == name; });
    std::error_code ec;
    if (!taken && fs::is_regular_file(src, ec)) out.push_back({src.string(), name});
  };
  std::error_code ec;
  if (const std::string given = runTokenizer(cfg); !given.empty() && fs::exists(given, ec)) {
    const data::Tokenizer tok(given);
    const bool json = tok.kind() == "tokenizer.json";
    add(tok.path(), json ? "tokenizer.json" : "tokenizer.model");
    if (json)
      for (const char* side : {"tokenizer_config.json", "special_tokens_map.json"})
        add(fs::path(tok.path()).parent_path() / side, side);
  }
  if (cfg.contains("model") && cfg["model"].is_object() && cfg["model"].value("init_from", "") != "")
    for (const auto& f : ckpt::kTokenizerFiles) add(fs::path(cfg["model"]["init_from"].get<std::string>()) / f, f);
  return out;
}

// The tokenizer_config.json Hugging Face's AutoTokenizer needs beside a tokenizer that came
// without one: its class, BOS, EOS and the longest sequence the run trained on.
std::string tokenizerConfig(const data::Tokenizer& tok, const nlohmann::json& cfg) {
  nlohmann::json j = {{"tokenizer_class", tok.kind() == "tokenizer.json" ? "PreTrainedTokenizerFast" : "LlamaTokenizer"}};
  if (tok.bosId() >= 0) j["bos_token"] = tok.tokenText(tok.bosId());
  if (tok.eosId() >= 0) j["eos_token"] = tok.tokenText(tok.eosId());
  if (cfg.contains("data") && cfg["data"].is_object() && cfg["data"].contains("seq_len") &&
      cfg["data"]["seq_len"].is_number_integer())
    j["model_max_length"] = cfg["data"]["seq_len"];
  return j.dump(2) + "\n";
}

int exportFile(const ckpt::Checkpoint& c, const ExportFlags& f, int64_t n) {
  LT_CHECK(f.dtype == "fp32", "export --dtype ", f.dtype, " is for a model directory; give --out DIR");
  std::error_code ec;
  LT_CHECK(!fs::is_directory(f.out, ec), "export --out '", f.out, "' is a directory; give a new file name ending in ",
           ".safetensors, or a directory name without that ending for a model directory");
  const fs::path parent = fs::path(f.out).parent_path();
  ckpt::checkWritable(parent.empty() ? "." : parent.string(), "export --out's directory");
  ckpt::exportModel(c, f.out);
  std::printf("export: %s (step %lld) -> %s: %zu tensors, %.2fM parameters, fp32, Hugging Face names\n",
              c.dir().c_str(), (long long)c.manifest().step, f.out.c_str(), c.manifest().params.size(), n / 1e6);
  return 0;
}

int exportDirectory(const ckpt::Checkpoint& c, const ExportFlags& f) {
  ckpt::HfExportOptions o;
  o.dtype = f.dtype;
  o.tokenizerFiles = runTokenizerFiles(c.manifest().config);
  for (const auto& t : o.tokenizerFiles)
    if ((t.name == "tokenizer.model" || t.name == "tokenizer.json") && o.eosId < 0) {
      const data::Tokenizer tok(t.source);
      o.bosId = tok.bosId();
      o.eosId = tok.eosId();
      o.tokenizerConfigJson = tokenizerConfig(tok, c.manifest().config);
    }
  const auto r = ckpt::exportHfDirectory(c, f.out, o);
  std::string copied;
  for (const auto& name : r.copied) copied += " " + name;
  std::printf("export: %s (step %lld) -> %s/: config.json, model.safetensors (%lld tensors, %.2fM parameters, %s, "
              "%.1f MiB)%s%s\n",
              c.dir().c_str(), (long long)c.manifest().step, f.out.c_str(), (long long)r.tensors, r.parameters / 1e6,
              f.dtype.c_str(), r.bytes / 1048576.0, copied.empty() ? "" : ", tokenizer:", copied.c_str());
  std::printf("        load it with model.init_from=%s (longtrain) or AutoModelForCausalLM.from_pretrained (Hugging Face)\n",
              f.out.c_str());
  return 0;
}

int runExport(const ExportFlags& f) {
  const ckpt::Checkpoint c(ckpt::resolve(f.ckpt, "export CKPT"));
  int64_t n = 0;
  for (const auto& p : c.manifest().params) n += p.numel();
  const std::string suffix = ".safetensors";
  const bool oneFile = f.out.size() > suffix.size() && f.out.compare(f.out.size() - suffix.size(), suffix.size(), suffix) == 0;
  return oneFile ? exportFile(c, f, n) : exportDirectory(c, f);
}

}  // namespace

Command exportCommand(CLI::App& app) {
  auto f = std::make_shared<ExportFlags>();
  auto* exp = app.add_subcommand("export", "write a checkpoint's model as a Hugging Face directory (config.json, "
                                           "model.safetensors, the tokenizer), or as one .safetensors file");
  exp->add_option("CKPT", f->ckpt, "a checkpoint directory, or a root (its newest complete checkpoint)")->required();
  exp->add_option("--out", f->out, "the model directory to write (or a file ending in .safetensors: the weights "
                                   "alone)")->required();
  exp->add_option("--dtype", f->dtype, "dtype of the written weights: fp32 (exact) or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  return {exp, [f] { return runExport(*f); }};
}

}  // namespace lt::cli
