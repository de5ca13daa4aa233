// The process baseline (process_baseline.h): a calibration run of this binary, recorded per
// binary (its path, size and modification time) in process_baselines.json.
#include "longtrain/train/process_baseline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "longtrain/core/memory.h"
#include "longtrain/kernels/gemm.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/train/peak_record.h"
#include "longtrain/train/record_file.h"

namespace lt::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// 0.02M parameters, 64 tokens, 1 step: everything but the process is < 1 MiB.
constexpr const char* kTinyRun = R"({
  "train_micro_batch_size_per_gpu": 1,
  "model": {"vocab_size": 64, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 48},
  "data": {"seq_len": 64, "num_samples": 64, "eval_samples": 0,
           "kv": {"num_pairs": 4, "num_queries": 4, "num_keys": 16, "num_values": 8, "num_noise": 8}},
  "train": {"steps": 1, "memory_preflight": false}
})";

std::string selfExe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

// This build of the binary at `exe`: its path, size and modification time ("" if unreadable).
std::string buildOf(const std::string& exe) {
  struct stat st {};
  if (exe.empty() || ::stat(exe.c_str(), &st) != 0) return "";
  return fmt::format("{} | {} bytes | mtime {} |", exe, static_cast<long long>(st.st_size),
                     static_cast<long long>(st.st_mtime));
}

// The record's key: this build, one rank or several, the thread count.
std::string recordKey(const std::string& exe, int ranks, int threads) {
  const std::string build = buildOf(exe);
  if (build.empty()) return "";
  return fmt::format("{} {} | {} threads", build, ranks > 1 ? "several ranks" : "one rank", threads);
}

// Drops the entries of earlier builds at this path, so the record keeps one build per binary
// instead of growing with every rebuild.
void forgetEarlierBuilds(json& record, const std::string& exe) {
  const std::string build = buildOf(exe);
  for (auto it = record.begin(); it != record.end();) {
    const std::string& k = it.key();
    if (k.rfind(exe + " | ", 0) == 0 && k.rfind(build, 0) != 0)
      it = record.erase(it);
    else
      ++it;
  }
}

// What runs of this binary measured: rank 0's peak RSS, its RSS after the step and of that the
// free pages tcmalloc holds (rss_bytes, allocator_free_bytes); `released`: its RSS after the step
// in a second run under a train.memory_budget, which decommits freed spans. Measured, not rss -
// free: some free pages were never touched, so releasing them frees no RSS (4 MiB of the 15.5
// free at one rank: every budgeted row of bench/plan_accuracy.sh under-predicted by about that).
struct Sample {
  int64_t peak = 0, rss = 0, free = 0, released = 0;
  bool valid() const { return peak > 0 && rss > 0 && released > 0; }
};

// This process after the GEMM a run's start-up runs (machine.cpp's 1024^3 measurement; constant
// operands: no generator is drawn from): where no run can be measured.
Sample thisProcess() {
  {
    constexpr int64_t n = 1024;
    auto a = at::full({n, n}, 0.5f), b = at::full({n, n}, 0.25f), c = at::empty({n, n});
    kernels::matmulInto(c, a, false, b, false, kernels::GemmRoute::Blas);
  }
  const int64_t rss = currentRssBytes(), free = std::max<int64_t>(0, allocatorFreeBytes());
  return {rss, rss, free, rss - free};  // released: rss - free, the estimate a few MiB low (Sample)
}

int64_t field(const json& j, const char* k) {
  return j.is_object() && j.value(k, json()).is_number_integer() ? j[k].get<int64_t>() : 0;
}

// The tiny run on `ranks` process ranks, `budgeted` or not; invalid where it cannot run.
Sample runTiny(const std::string& exe, int ranks, int threads, bool budgeted) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("longtrain-baseline-{}", ::getpid());
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::ofstream(dir / "tiny.json") << kTinyRun;
  const std::string cmd = fmt::format("'{}' train '{}' --nproc {} --set sequence_parallel_size={} --set train.threads={} "
                                      "{}--metrics '{}' >/dev/null 2>&1",
                                      exe, (dir / "tiny.json").string(), ranks, ranks, threads,
                                      budgeted ? "--set 'train.memory_budget=\"1GiB\"' " : "", (dir / "m.jsonl").string());
  Sample s;
  if (std::system(cmd.c_str()) == 0) {
    std::ifstream in(dir / "m.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const json j = json::parse(line, nullptr, false);
      s = {std::max(s.peak, field(j, "peak_rss_bytes")), field(j, "rss_bytes"), field(j, "allocator_free_bytes"), 0};
    }
  }
  fs::remove_all(dir, ec);
  return s;
}


fs::path recordFile() {
  const std::string dir = peakRecordDir();
  return dir.empty() ? fs::path() : fs::path(dir) / "process_baselines.json";
}

// The sample of `ranks` ranks: the record's, else (where `mayRun`) a run's, then recorded.
Sample sampleOf(int ranks, int threads, bool mayRun) {
  const std::string exe = selfExe(), key = recordKey(exe, ranks, threads);
  const fs::path file = recordFile();
  if (key.empty()) return {};
  const json r = file.empty() ? json::object() : readRecord(file);
  const json e = r.contains(key) ? r[key] : json();
  Sample s{field(e, "peak"), field(e, "rss"), field(e, "free"), field(e, "released")};
  if (s.valid() || !mayRun) return s;
  s = runTiny(exe, ranks, threads, false);
  s.released = runTiny(exe, ranks, threads, true).rss;
  if (s.valid() && !file.empty()) {
    json w = readRecord(file);
    forgetEarlierBuilds(w, exe);
    w[key] = {{"peak", s.peak}, {"rss", s.rss}, {"free", s.free}, {"released", s.released}};
    (void)writeRecord(file, w);
  }
  return s;
}

// Which of the run's free pages later tensors reuse, as bench/plan_accuracy.sh's rows measure it:
// at one rank none (it peaks at the run's RSS plus the step's live bytes, within 3% on the fused
// rows), at several all (a process group's start-up frees whole buffers, ~45 MiB a rank). Under
// a train.memory_budget they are returned to the OS (`released`, measured so).
plan::ProcessBaseline baselineOf(int world, int localRanks, int threads, bool mayRun) {
  Sample s = sampleOf(world > 1 ? 2 : 1, rankThreads(localRanks, threads), mayRun);
  if (!s.valid()) s = thisProcess();
  return {world > 1 ? s.rss - s.free : s.rss, s.peak, s.released};
}

}  // namespace

int rankThreads(int localRanks, int threads) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return threads > 0 ? threads : std::max(1, cores / std::max(1, std::min(localRanks, cores)));
}

int64_t calibrateProcessBaseline(int world, int localRanks, int threads) {
  const plan::ProcessBaseline b = baselineOf(world, localRanks, threads, true);
  plan::setProcessBaseline(b);
  return b.resident;
}

int64_t rankProcessBaseline(int world, int localRanks, int threads) {
  const plan::ProcessBaseline b = baselineOf(world, localRanks, threads, false);
  plan::setProcessBaseline(b);
  return b.resident;
}

}  // namespace lt::train
