// Loading: an opened checkpoint verifies every file's size and CRC-32C before a byte of state
// is read; a parameter range is assembled from whichever rank files hold it, so any layout
// loads into any other. Export writes the consolidated model.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/ckpt/safetensors.h"
#include "longtrain/core/check.h"
#include "longtrain/core/files.h"
#include "longtrain/core/crc32c.h"
#include "longtrain/core/partition.h"

namespace lt::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const fs::path mp = fs::path(dir) / kManifestFile;
  std::error_code ec;
  LT_CHECK(fs::exists(mp, ec), "'", dir, "' is not a complete checkpoint: it has no ", kManifestFile);
  const std::string what = fmt::format("'{}'", mp.string());
  m_ = parseManifest(readInputFile(mp.string(), what), what);
  for (const auto& f : m_.files) {
    const std::string p = (fs::path(dir) / f.name).string();
    struct stat st{};
    LT_CHECK(::stat(p.c_str(), &st) == 0, "checkpoint file '", p, "' is missing (the manifest lists it)");
    LT_CHECK(st.st_size == f.bytes, "checkpoint file '", p, "' has ", st.st_size, " bytes, the manifest says ", f.bytes,
             ": it is truncated or was replaced; refusing to load it");
    files_.push_back(std::make_unique<SafetensorsFile>(p, [&](const uint8_t* data, size_t size) {
      uint32_t crc = crc32c(data, size);
      LT_CHECK(crc == f.crc32c, "checkpoint file '", p, "' is corrupt: its CRC-32C is ", crcHex(crc),
               ", the manifest says ", crcHex(f.crc32c), "; refusing to load it (resume from an older checkpoint)");
    }));
  }
}

Checkpoint::~Checkpoint() = default;

void Checkpoint::read(int param, const std::string& kind, int64_t offset, at::Tensor dst) const {
  LT_ASSERT(param >= 0 && param < static_cast<int>(m_.params.size()));
  const auto& p = m_.params[param];
  const int64_t numel = p.numel(), n = dst.numel();
  LT_ASSERT(offset >= 0 && offset + n <= numel, "range outside parameter ", p.name);
  const std::string name = kind.empty() ? p.name : p.name + "." + kind;
  auto piece = [&](int rank, int64_t lo, int64_t hi) {  // file `rank` holds [lo, hi)
    const auto& f = *files_[rank];
    const TensorEntry* e = f.find(name);
    LT_CHECK(e, "checkpoint file '", f.path(), "' has no tensor '", name, "' (the manifest's layout says it should)");
    at::Tensor v = f.view(name);
    LT_CHECK(v.scalar_type() == at::kFloat && v.dim() == 1 && v.numel() == hi - lo, "checkpoint file '", f.path(),
             "': tensor '", name, "' is ", e->dtype, " of ", v.numel(), " elements, expected F32 of ", hi - lo);
    const int64_t a = std::max(lo, offset), b = std::min(hi, offset + n);
    if (b > a) dst.narrow(0, a - offset, b - a).copy_(v.narrow(0, a - lo, b - a));
  };
  if (!m_.partitioned) return piece(0, 0, numel);
  const int64_t W = m_.worldSize, c = partitionChunk(numel, W);
  if (n == 0 || c == 0) return;
  for (int64_t r = offset / c; r <= (offset + n - 1) / c && r < W; ++r)
    piece(static_cast<int>(r), r * c, std::min(numel, (r + 1) * c));
}

at::Tensor Checkpoint::full(int param, const std::string& kind) const {
  const auto& p = m_.params.at(param);
  auto t = at::empty({p.numel()}, at::kFloat);
  read(param, kind, 0, t);
  return t.view(p.shape);
}

at::Tensor Checkpoint::rngState(int rank) const {
  const auto& f = *files_.at(rank);
  return f.find("rng.cpu") ? f.view("rng.cpu").clone() : at::Tensor();
}

void load(TrainState& e, const Checkpoint& c) {
  const Manifest& m = c.manifest();
  const auto& cfg = e.config();
  const std::string what = "checkpoint '" + c.dir() + "'";
  // The model must be the same one: name the keys that differ.
  json now = json::parse(cfg.source);
  json then = m.config.contains("model") ? m.config["model"] : json::object();
  json nowModel = now.contains("model") ? now["model"] : json::object();
  if (then != nowModel) {
    std::string diffs;
    for (const auto& op : json::diff(then, nowModel)) diffs += " model" + op["path"].get<std::string>();
    LT_CHECK(false, what, " was saved for a different model; these keys differ:", diffs,
             ". Use the config it was saved with (its manifest.json holds it)");
  }
  const auto meta = e.parameterMeta();
  LT_CHECK(meta.size() == m.params.size(), what, " has ", m.params.size(), " parameters, this model ", meta.size());
  for (size_t i = 0; i < meta.size(); ++i)
    LT_CHECK(meta[i].name == m.params[i].name && meta[i].shape == m.params[i].shape, what, ": parameter ", i, " is '",
             m.params[i].name, "' there and '", meta[i].name, "' here (or their shapes differ)");
  LT_CHECK(m.trainBatchSize == cfg.trainBatchSize, what, " was taken at train_batch_size=", m.trainBatchSize,
           ", this run has ", cfg.trainBatchSize, ": the data position cannot carry over; keep train_batch_size (",
           "change train_micro_batch_size_per_gpu or gradient_accumulation_steps with the world size instead)");

  e.resetToStep(m.step, m.adamStep, m.skippedSteps);
  for (const auto& s : e.stateShards()) {
    auto view = [&](float* p) { return at::from_blob(p, {s.length}, at::kFloat); };
    c.read(s.param, "", s.offset, view(s.master));
    c.read(s.param, "exp_avg", s.offset, view(s.expAvg));
    c.read(s.param, "exp_avg_sq", s.offset, view(s.expAvgSq));
  }
  const int r = e.world().rank();
  const bool sameLayout = m.worldSize == e.world().size() && m.spSize == cfg.sequenceParallelSize &&
                          m.partitioned == e.statePartitioned();
  if (sameLayout)
    LT_ASSERT(e.loaderCursor() == m.loaderCursors[r], what, ": rank ", r, " data position ", e.loaderCursor(),
              " != the saved ", m.loaderCursors[r]);
  at::Tensor rng = c.rngState(sameLayout ? r : 0);
  if (rng.defined()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
}

void exportModel(const Checkpoint& c, const std::string& outPath) {
  std::vector<NamedTensor> ts;
  for (size_t i = 0; i < c.manifest().params.size(); ++i)
    ts.push_back({c.manifest().params[i].name, c.full(static_cast<int>(i))});
  writeSafetensors(outPath, ts, {{"format", "pt"}});
}

}  // namespace lt::ckpt
