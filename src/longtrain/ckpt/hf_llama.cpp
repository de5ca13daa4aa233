// Hugging Face directory I/O. The index (model.safetensors.index.json) maps each tensor name to
// its shard; a directory without one has a single model.safetensors.
#include "longtrain/ckpt/hf_llama.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/core/check.h"
#include "longtrain/config/hf_llama_config.h"
#include "longtrain/config/json_text.h"
#include "longtrain/config/parse.h"

namespace lt::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::vector<std::string> kTokenizerFiles = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                                  "special_tokens_map.json"};

namespace {

// Shard file names in the index's order of first appearance.
std::vector<std::string> shardNames(const std::string& indexPath) {
  const json j = config::readJson(indexPath, "'" + indexPath + "'");
  LT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "'",
           indexPath, "' is not a safetensors index (a JSON object with a \"weight_map\" of tensor name -> file)");
  std::vector<std::string> out;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    LT_CHECK(it->is_string(), "'", indexPath, "': weight_map[\"", it.key(), "\"] must be a file name");
    const std::string s = it->get<std::string>();
    LT_CHECK(s.find('/') == std::string::npos, "'", indexPath, "': shard '", s, "' must be a file in the directory");
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

bool ignorableExtra(const std::string& name, bool tied) {
  const std::string buf = ".rotary_emb.inv_freq";
  return (name.size() > buf.size() && name.compare(name.size() - buf.size(), buf.size(), buf) == 0) ||
         (tied && name == "lm_head.weight");
}

std::string joinNames(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 20; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > 20) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

}  // namespace

HfWeights::HfWeights(const std::string& dir, const std::string& what) : dir_(dir), what_(what) {
  const fs::path d(dir), index = d / "model.safetensors.index.json", single = d / "model.safetensors";
  std::error_code ec;
  std::vector<std::string> names;
  if (fs::exists(index, ec)) names = shardNames(index.string());
  else if (fs::exists(single, ec)) names = {"model.safetensors"};
  LT_CHECK(!names.empty(), what_, ": '", dir, "' has neither model.safetensors nor ",
           "model.safetensors.index.json (a PyTorch .bin checkpoint must be converted to safetensors first)");
  for (const auto& n : names) {
    LT_CHECK(fs::is_regular_file(d / n, ec), what_, ": '", (d / n).string(), "' is named by the index but missing");
    files_.push_back(std::make_unique<SafetensorsFile>((d / n).string()));
    for (const auto& e : files_.back()->header().tensors) {
      where_.push_back({e.name, static_cast<int>(files_.size()) - 1});
    }
  }
  std::sort(where_.begin(), where_.end());
  for (size_t i = 1; i < where_.size(); ++i)
    LT_CHECK(where_[i].first != where_[i - 1].first, what_, ": tensor '", where_[i].first,
             "' appears in two shards of '", dir, "'");
}

HfWeights::~HfWeights() = default;

int HfWeights::fileIndexOf(const std::string& name) const {
  auto it = std::lower_bound(where_.begin(), where_.end(), std::make_pair(name, -1));
  return it != where_.end() && it->first == name ? it->second : -1;
}

const SafetensorsFile& HfWeights::fileOf(const std::string& name) const {
  const int f = fileIndexOf(name);
  LT_CHECK(f >= 0, what_, ": '", dir_, "' has no tensor '", name, "'");
  return *files_[f];
}

void HfWeights::check(const std::vector<ExpectedTensor>& expected, bool tied) const {
  std::vector<std::string> missing, misShaped, unexpected;
  for (const auto& e : expected) {
    const int f = fileIndexOf(e.name);
    if (f < 0) {
      missing.push_back(e.name);
      continue;
    }
    const TensorEntry* t = files_[f]->find(e.name);
    const bool floating = t->dtype == "F32" || t->dtype == "BF16" || t->dtype == "F16";
    if (t->shape != e.shape || !floating)
      misShaped.push_back(lt::detail::concat(e.name, " (", t->dtype, " ", at::IntArrayRef(t->shape),
                                             ", expected F32/BF16/F16 ", at::IntArrayRef(e.shape), ")"));
  }
  for (const auto& [name, f] : where_) {
    const bool known = std::any_of(expected.begin(), expected.end(), [&](const auto& e) { return e.name == name; });
    if (!known && !ignorableExtra(name, tied)) unexpected.push_back(name);
  }
  std::string msg;
  if (!missing.empty()) msg += "; missing: " + joinNames(missing);
  if (!unexpected.empty()) msg += "; unexpected: " + joinNames(unexpected);
  if (!misShaped.empty()) msg += "; wrong shape or dtype: " + joinNames(misShaped);
  LT_CHECK(msg.empty(), what_, ": the weights in '", dir_, "' do not fit the model its config.json (and ",
           "the config's model section) describe", msg);
}

void HfWeights::read(const std::string& name, int64_t offset, at::Tensor dst) const {
  at::Tensor flat = fileOf(name).view(name).reshape({-1});
  LT_ASSERT(offset >= 0 && offset + dst.numel() <= flat.numel());
  dst.copy_(flat.narrow(0, offset, dst.numel()));
}

namespace {

// The training config a checkpoint recorded, without re-reading init_from (its model keys are
// resolved into the record).
config::Config checkpointConfig(const Checkpoint& c) {
  json cfgJson = c.manifest().config;
  if (cfgJson.contains("model") && cfgJson["model"].is_object()) cfgJson["model"].erase("init_from");
  return config::parseConfig(cfgJson, c.manifest().worldSize);
}

std::vector<ExpectedTensor> expectedOf(const model::Model& m) {
  std::vector<ExpectedTensor> out;
  for (int g : m.groupOrder())
    for (const auto& p : m.group(g)) out.push_back({p.name, p.tensor.sizes().vec()});
  return out;
}

}  // namespace

InferenceModel loadInferenceModel(const std::string& path, const std::string& what) {
  InferenceModel r;
  std::error_code ec;
  if (fs::is_regular_file(fs::path(path) / "config.json", ec)) {
    model::ModelConfig mc = config::readHfLlamaConfig(path, what).model;
    mc.resolved.oneDnnGemm = model::oneDnnRunsFp32Gemms(mc.gemm);
    r.model = std::make_unique<model::Model>(mc, 0, /*initialize=*/false);
    HfWeights w(path, what);
    const auto expected = expectedOf(*r.model);
    w.check(expected, mc.tieEmbeddings);
    auto params = r.model->parameters();
    for (size_t i = 0; i < params.size(); ++i) w.read(expected[i].name, 0, params[i].detach().view({-1}));
    for (const char* name : {"tokenizer.json", "tokenizer.model"})  // data::Tokenizer picks between them
      if (fs::is_regular_file(fs::path(path) / name, ec)) r.tokenizer = path;
    r.describe = "Hugging Face model " + path;
    return r;
  }
  Checkpoint c(resolve(path, what));
  config::Config cfg = checkpointConfig(c);
  cfg.model.resolved.oneDnnGemm = model::oneDnnRunsFp32Gemms(cfg.model.gemm);  // as the run resolved it
  r.model = std::make_unique<model::Model>(cfg.model, 0, /*initialize=*/false);
  auto params = r.model->parameters();
  LT_CHECK(params.size() == c.manifest().params.size(), "checkpoint '", c.dir(), "' holds ",
           c.manifest().params.size(), " parameters, its config's model ", params.size());
  for (size_t i = 0; i < params.size(); ++i) c.read(static_cast<int>(i), "", 0, params[i].detach().view({-1}));
  r.tokenizer = cfg.data.tokenizer;
  r.promptAfterEos = cfg.data.packing == config::Packing::Documents;
  r.describe = "checkpoint " + c.dir() + " (step " + std::to_string(c.manifest().step) + ")";
  return r;
}

HfExportResult exportHfDirectory(const Checkpoint& c, const std::string& outDir, const HfExportOptions& o) {
  LT_CHECK(o.dtype == "fp32" || o.dtype == "bf16", "export --dtype ", o.dtype, ": expected fp32 or bf16");
  const config::Config cfg = checkpointConfig(c);
  config::HfLlamaConfig hc;
  hc.model = cfg.model;
  hc.maxPositions = std::max(cfg.model.maxPositions, cfg.data.seqLen);
  hc.torchDtype = o.dtype == "bf16" ? "bfloat16" : "float32";
  checkWritable(outDir, "export --out");  // before any tensor is read
  HfExportResult r;
  std::vector<NamedTensor> ts;
  for (size_t i = 0; i < c.manifest().params.size(); ++i) {
    at::Tensor t = c.full(static_cast<int>(i));
    r.parameters += t.numel();
    ts.push_back({c.manifest().params[i].name, o.dtype == "bf16" ? t.to(at::kBFloat16) : t});
  }
  r.tensors = static_cast<int64_t>(ts.size());
  r.bytes = writeSafetensors((fs::path(outDir) / "model.safetensors").string(), ts, {{"format", "pt"}}).bytes;
  for (const auto& [src, name] : o.tokenizerFiles) {
    std::error_code ec;
    if (src.empty() || !fs::is_regular_file(src, ec)) continue;
    const fs::path dst = fs::path(outDir) / name;
    if (fs::exists(dst, ec) && fs::equivalent(src, dst, ec)) continue;
    fs::copy_file(src, dst, fs::copy_options::overwrite_existing, ec);
    LT_CHECK(!ec, "export: cannot copy '", src, "' to '", dst.string(), "': ", ec.message());
    r.copied.push_back(dst.filename().string());
  }
  const bool hasConfig = std::find(r.copied.begin(), r.copied.end(), "tokenizer_config.json") != r.copied.end();
  if (!hasConfig && !o.tokenizerConfigJson.empty()) {
    AtomicFile t((fs::path(outDir) / "tokenizer_config.json").string());
    t.write(o.tokenizerConfigJson.data(), o.tokenizerConfigJson.size());
    t.commit();
    r.copied.push_back("tokenizer_config.json");
  }
  hc.bosId = o.bosId;
  hc.eosId = o.eosId;
  // config.json last: a directory is a loadable model once it exists.
  const std::string text = config::hfLlamaConfigJson(hc).dump(2) + "\n";
  AtomicFile f((fs::path(outDir) / "config.json").string());
  f.write(text.data(), text.size());
  f.commit();
  return r;
}

}  // namespace lt::ckpt
