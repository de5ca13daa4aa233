// F.bin.json: read, written, and applied to the data section. Non-obvious: the sidecar's
// tokenizer becomes data.tokenizer only while that file still exists, so a token file moved to
// another machine still trains (with its EOS) but asks for the tokenizer where one is needed.
#include "longtrain/config/token_sidecar.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "longtrain/config/json_text.h"
#include "longtrain/core/check.h"

namespace lt::config {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "longtrain.tokens/1";

std::string tokenSidecarPath(const std::string& tokenFile) { return tokenFile + ".json"; }

std::optional<TokenSidecar> readTokenSidecar(const std::string& tokenFile) {
  const std::string path = tokenSidecarPath(tokenFile);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  const json j = readJson(path, "token-file sidecar '" + path + "'");  // a FIFO, deep nesting: refused
  const bool ours = j.is_object() && j.contains("format") && j["format"].is_string() && j["format"] == kFormat;
  LT_CHECK(ours, "'", path,
           "' is not a longtrain token-file sidecar (format \"", kFormat, "\"); rewrite it with longtrain tokenize, ",
           "or remove it");
  TokenSidecar s;
  try {
    s.dtype = j.at("dtype").get<std::string>();
    const json& t = j.at("tokenizer");
    s.tokenizer = t.value("path", ""), s.tokenizerKind = t.value("kind", ""), s.tokenizerSha256 = t.value("sha256", "");
    s.vocabSize = t.value("vocab_size", int64_t{0});
    s.eosId = j.value("eos_id", int64_t{-1}), s.bosId = j.value("bos_id", int64_t{-1});
    s.documents = j.value("documents", int64_t{0}), s.tokens = j.value("tokens", int64_t{0});
    s.inputs = j.value("inputs", std::vector<std::string>{});
    s.splitOn = j.value("split_on", "");
  } catch (const json::exception& e) {
    LT_CHECK(false, "'", path, "' lacks a field or has one of the wrong type (", e.what(), "); rewrite it with ",
             "longtrain tokenize");
  }
  LT_CHECK(s.dtype == "uint16" || s.dtype == "uint32", "'", path, "': dtype \"", s.dtype, "\" is not uint16 or uint32");
  return s;
}

std::string tokenSidecarJson(const TokenSidecar& s) {
  json j;
  j["format"] = kFormat;
  j["dtype"] = s.dtype;
  j["tokenizer"] = {{"path", s.tokenizer}, {"kind", s.tokenizerKind}, {"sha256", s.tokenizerSha256},
                    {"vocab_size", s.vocabSize}};
  j["eos_id"] = s.eosId;
  j["bos_id"] = s.bosId;
  j["documents"] = s.documents;
  j["tokens"] = s.tokens;
  j["inputs"] = s.inputs;
  j["split_on"] = s.splitOn;
  return j.dump(2) + "\n";
}

void applyTokenSidecar(DataConfig& d) {
  if (!d.tokenFile() || d.path.empty()) return;
  const std::optional<TokenSidecar> s = readTokenSidecar(d.path);
  if (!s) return;
  LT_CHECK(optionName(d.type) == s->dtype, "config key 'data.type' = \"", d.type, "\", but '", tokenSidecarPath(d.path),
           "' says '", d.path, "' holds ", s->dtype, " tokens (written by longtrain tokenize); set data.type=\"",
           s->dtype, "\"");
  if (d.eosId < 0) d.eosId = s->eosId;
  std::error_code ec;
  if (d.tokenizer.empty() && !s->tokenizer.empty() && fs::exists(s->tokenizer, ec)) d.tokenizer = s->tokenizer;
}

}  // namespace lt::config
