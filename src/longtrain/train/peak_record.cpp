// The per-machine GEMM peak record (peak_record.h). Written to a temporary file and renamed
// over the old one, so ranks of one host updating it at once never leave it half-written.
#include "longtrain/train/peak_record.h"
#include "longtrain/train/record_file.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace lt::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

const char* routeName(kernels::GemmRoute r) {
  switch (r) {
    case kernels::GemmRoute::Blas: return "fp32 BLAS";
    case kernels::GemmRoute::OneDnn: return "fp32 oneDNN";
    case kernels::GemmRoute::Bf16: return "bf16";
  }
  return "?";
}

}  // namespace

json readRecord(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return json::object();
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : json::object();  // a damaged record is started afresh
}

bool writeRecord(const std::filesystem::path& file, const json& j) {
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  const fs::path tmp = file.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!(out << j.dump(2) << "\n")) return false;
  }
  fs::rename(tmp, file, ec);
  if (ec) fs::remove(tmp, ec);
  return !ec;
}

std::string peakRecordDir() {
  if (const char* d = std::getenv("LONGTRAIN_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "longtrain").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "longtrain").string();
  return "";
}

GemmPeak robustGemmPeak(kernels::GemmRoute route, double measured, double configured) {
  if (configured > 0) return {configured, "train.peak_flops"};
  const std::string dir = peakRecordDir();
  if (dir.empty()) return {measured, "measured at start-up"};
  const fs::path file = fs::path(dir) / "gemm_peaks.json";
  const std::string key = fmt::format("{} | {} threads | {} | libtorch {}", cpuModel(), at::get_num_threads(),
                                      routeName(route), TORCH_VERSION);
  json record = readRecord(file);
  json& entry = record[key];
  const bool valid = entry.is_object() && entry.value("flops", json()).is_number() &&
                     entry.value("measurements", json()).is_number_integer();
  if (!valid) entry = {{"flops", 0.0}, {"measurements", 0}};  // new, or damaged: started afresh
  const double best = std::max(measured, entry["flops"].get<double>());
  const int64_t runs = entry["measurements"].get<int64_t>() + 1;
  entry = {{"flops", best}, {"measurements", runs}};
  if (!writeRecord(file, record)) return {measured, "measured at start-up (" + file.string() + " not writable)"};
  return {best, fmt::format("the best of {} start-up measurements on this CPU and thread count, in {}", runs,
                            file.string())};
}

}  // namespace lt::train
