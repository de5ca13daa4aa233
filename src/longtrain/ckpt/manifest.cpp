// Manifest JSON out and in, and the names of a checkpoint's files.
#include "longtrain/ckpt/manifest.h"

#include <fmt/format.h>

#include <algorithm>

#include "longtrain/config/json_reader.h"
#include "longtrain/config/json_text.h"
#include "longtrain/core/check.h"

namespace lt::ckpt {

using json = nlohmann::json;

namespace {
constexpr const char* kFormat = "longtrain-checkpoint";
constexpr int kVersion = 1;
}  // namespace

std::string crcHex(uint32_t v) { return fmt::format("{:08x}", v); }

int64_t ParamRecord::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::string configHash(const std::string& canonical) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : canonical) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

std::string checkpointDirName(int64_t step) { return fmt::format("step-{:08d}", step); }
std::string rankFileName(int rank, int world) { return fmt::format("rank-{:05d}-of-{:05d}.safetensors", rank, world); }

std::string manifestJson(const Manifest& m) {
  json params = json::array(), files = json::array();
  for (const auto& p : m.params) params.push_back({{"name", p.name}, {"shape", p.shape}});
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32c", crcHex(f.crc32c)}});
  json j = {{"format", kFormat},
            {"version", kVersion},
            {"step", m.step},
            {"adam_step", m.adamStep},
            {"skipped_steps", m.skippedSteps},
            {"data", {{"samples_consumed", m.samplesConsumed},
                      {"train_batch_size", m.trainBatchSize},
                      {"loader_cursors", m.loaderCursors}}},
            {"layout", {{"world_size", m.worldSize},
                        {"sequence_parallel_size", m.spSize},
                        {"zero_stage", m.zeroStage},
                        {"partitioned", m.partitioned}}},
            {"config_hash", m.configHash},
            {"run_id", m.runId},
            {"config", m.config},
            {"params", params},
            {"files", files}};
  return j.dump(1) + "\n";
}

namespace {

constexpr int64_t kCount = int64_t{1} << 40;  // bounds counts well inside int64: sums and products cannot overflow

ParamRecord parseParam(config::JsonReader f, const std::string& what) {
  ParamRecord r;
  r.name = f.requireString("name");
  int64_t numel = 1;
  for (const auto& s : f.requireArray("shape")) {
    LT_CHECK(s.is_number_integer() && s.get<int64_t>() >= 0 && s.get<int64_t>() <= kCount, what, ": params '", r.name,
             "': bad shape entry ", s.dump().substr(0, 40));
    r.shape.push_back(s.get<int64_t>());
    LT_CHECK(numel <= kCount / std::max<int64_t>(1, s.get<int64_t>()), what, ": params '", r.name, "': shape too large");
    numel *= s.get<int64_t>();
  }
  return r;
}

FileRecord parseFile(config::JsonReader f, const std::string& what) {
  FileRecord r;
  r.name = f.requireString("name");
  LT_CHECK(!r.name.empty() && r.name.find('/') == std::string::npos && r.name != "." && r.name != "..", what,
           ": file name '", r.name, "' must be a plain name inside the checkpoint directory");
  r.bytes = f.requireInt("bytes", 0, int64_t{1} << 50);
  const std::string c = f.requireString("crc32c");
  LT_CHECK(c.size() == 8 && c.find_first_not_of("0123456789abcdef") == std::string::npos, what, ": file '", r.name,
           "': crc32c '", c, "' is not 8 hex digits");
  r.crc32c = static_cast<uint32_t>(std::stoul(c, nullptr, 16));
  return r;
}

void parseData(config::JsonReader data, const std::string& what, Manifest& m) {
  m.samplesConsumed = data.requireInt("samples_consumed", 0, int64_t{1} << 60);
  m.trainBatchSize = data.requireInt("train_batch_size", 1, int64_t{1} << 20);
  LT_CHECK(m.samplesConsumed == m.step * m.trainBatchSize, what, ": data.samples_consumed ", m.samplesConsumed,
           " != step ", m.step, " x train_batch_size ", m.trainBatchSize);
  for (const auto& c : data.requireArray("loader_cursors")) {
    LT_CHECK(c.is_number_integer() && c.get<int64_t>() >= 0 && c.get<int64_t>() <= (int64_t{1} << 50), what,
             ": data.loader_cursors has a bad entry");
    m.loaderCursors.push_back(c.get<int64_t>());
  }
}

void parseLayout(config::JsonReader lay, const std::string& what, Manifest& m) {
  m.worldSize = static_cast<int>(lay.requireInt("world_size", 1, 1 << 20));
  m.spSize = static_cast<int>(lay.requireInt("sequence_parallel_size", 1, 1 << 20));
  m.zeroStage = static_cast<int>(lay.requireInt("zero_stage", 0, 3));
  m.partitioned = lay.requireBool("partitioned");
  LT_CHECK(m.worldSize % m.spSize == 0, what, ": world_size ", m.worldSize, " is not a multiple of ",
           "sequence_parallel_size ", m.spSize);
}

}  // namespace

Manifest parseManifest(const std::string& text, const std::string& what) {
  const json j = config::parseJsonText(text, what);  // depth and syntax checked, with line and column
  LT_CHECK(j.is_object(), what, ": not a JSON object");
  config::JsonReader top(&j, "", what + ": field");
  const std::string format = top.requireString("format");
  LT_CHECK(format == kFormat, what, ": field 'format' is '", format, "', expected '", kFormat, "'");
  const int64_t version = top.requireInt("version", 0, kCount);
  LT_CHECK(version == kVersion, what, ": version ", version, " is not supported (this build reads ", kVersion, ")");
  Manifest m;
  m.step = top.requireInt("step", 0, kCount);
  m.adamStep = top.requireInt("adam_step", 0, kCount);
  m.skippedSteps = top.requireInt("skipped_steps", 0, kCount);
  LT_CHECK(m.adamStep + m.skippedSteps == m.step, what, ": adam_step ", m.adamStep, " + skipped_steps ",
           m.skippedSteps, " != step ", m.step);
  parseData(top.requireObject("data"), what, m);
  parseLayout(top.requireObject("layout"), what, m);
  LT_CHECK(static_cast<int>(m.loaderCursors.size()) == m.worldSize, what, ": data.loader_cursors has ",
           m.loaderCursors.size(), " entries for world_size ", m.worldSize);
  m.configHash = top.requireString("config_hash");
  m.runId = top.requireString("run_id");
  m.config = top.require("config");
  LT_CHECK(m.config.is_object(), what, ": field 'config' must be an object");
  for (const auto& p : top.requireArray("params")) m.params.push_back(parseParam(config::JsonReader(&p, "params[]", what + ": field"), what));
  for (const auto& f : top.requireArray("files")) m.files.push_back(parseFile(config::JsonReader(&f, "files[]", what + ": field"), what));
  LT_CHECK(static_cast<int>(m.files.size()) == m.worldSize, what, ": ", m.files.size(), " files for world_size ",
           m.worldSize);
  return m;
}

}  // namespace lt::ckpt
