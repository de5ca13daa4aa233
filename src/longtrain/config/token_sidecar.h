// A token file's sidecar, F.bin.json: what `longtrain tokenize` wrote it with (the tokenizer's
// path, kind and SHA-256, dtype, EOS/BOS ids, documents, tokens, inputs). Reading a config,
// data.type is checked against it, and data.packing "documents" finds its EOS there. Plain
// JSON, no libtorch: config/ reads it, data/ writes it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "longtrain/config/config.h"

namespace lt::config {

struct TokenSidecar {
  std::string dtype;  // "uint16" | "uint32"
  std::string tokenizer, tokenizerKind, tokenizerSha256;
  int64_t vocabSize = 0, eosId = -1, bosId = -1, documents = 0, tokens = 0;
  std::vector<std::string> inputs;
  std::string splitOn;
};

std::string tokenSidecarPath(const std::string& tokenFile);  // tokenFile + ".json"
// The sidecar of `tokenFile`; none if there is none; lt::Error naming it if it is malformed.
std::optional<TokenSidecar> readTokenSidecar(const std::string& tokenFile);
std::string tokenSidecarJson(const TokenSidecar& s);  // indented, newline-terminated

// Fills data.eos_id and data.tokenizer from data.path's sidecar where they are not set, and
// refuses a data.type that disagrees with the dtype it records.
void applyTokenSidecar(DataConfig& d);

}  // namespace lt::config
