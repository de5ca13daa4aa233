// Hugging Face model directories: reading a Llama's weights (model.safetensors, or the shards
// of model.safetensors.index.json) and writing one (config.json, model.safetensors, the
// tokenizer files). Non-obvious: reading copies element ranges of the flattened tensors out
// of read-only mappings, so a ZeRO-3 rank touches only the pages of its own slices, and fp16 /
// bf16 files become fp32 in that copy.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "longtrain/ckpt/safetensors.h"
#include "longtrain/model/model.h"

namespace lt::ckpt {

class Checkpoint;

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

class HfWeights {
 public:
  // Opens DIR's safetensors (the index's shards, or model.safetensors). Errors name the file,
  // and `what`: the key or flag that gave DIR ("model.init_from", "generate MODEL").
  HfWeights(const std::string& dir, const std::string& what);
  ~HfWeights();
  // Every expected tensor present with its shape, and nothing else (rotary inv_freq buffers,
  // and lm_head.weight when `tied`, are allowed extras). Lists every missing, unexpected and
  // mis-shaped name in one error.
  void check(const std::vector<ExpectedTensor>& expected, bool tied) const;
  // Elements [offset, offset + dst.numel()) of tensor `name`, flattened, into dst (fp32).
  void read(const std::string& name, int64_t offset, at::Tensor dst) const;
  const std::string& dir() const { return dir_; }

 private:
  int fileIndexOf(const std::string& name) const;  // -1: no such tensor
  const SafetensorsFile& fileOf(const std::string& name) const;
  std::string dir_, what_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::pair<std::string, int>> where_;  // tensor name -> file index, sorted by name
};

// The files a tokenizer may consist of, copied along with a model directory.
extern const std::vector<std::string> kTokenizerFiles;

struct HfExportOptions {
  std::string dtype = "fp32";  // "fp32" | "bf16"
  // Tokenizer files to copy into the directory under their standard names (tokenizer.json,
  // tokenizer.model, tokenizer_config.json, ...); missing sources are skipped.
  struct TokenizerFile {
    std::string source, name;
  };
  std::vector<TokenizerFile> tokenizerFiles;
  int64_t bosId = -1, eosId = -1;  // the tokenizer's, recorded in config.json (-1: not written)
  // Written as tokenizer_config.json where tokenizerFiles brings none ("": nothing written).
  std::string tokenizerConfigJson;
};
struct HfExportResult {
  int64_t tensors = 0, parameters = 0, bytes = 0;
  std::vector<std::string> copied;  // tokenizer files copied
};

// A model for inference (generate): from a Hugging Face directory (config.json) or a
// checkpoint (a step directory or a root), with the tokenizer the directory or the run had.
struct InferenceModel {
  std::unique_ptr<model::Model> model;
  std::string tokenizer;  // "" if none is known
  // A run trained on packed documents saw EOS before every document and never BOS: a text
  // prompt then starts after an EOS; otherwise (Hugging Face models) after BOS.
  bool promptAfterEos = false;
  std::string describe;   // where it came from, for the user
};
InferenceModel loadInferenceModel(const std::string& path, const std::string& what);  // what: "generate MODEL"

// Writes a checkpoint's model as a Hugging Face Llama directory `outDir` (created if needed):
// config.json from the checkpoint's config, model.safetensors, and the tokenizer files.
HfExportResult exportHfDirectory(const Checkpoint& c, const std::string& outDir, const HfExportOptions& o);

}  // namespace lt::ckpt
