// bench/pointwise: fused RMSNorm and SwiGLU (forward + backward) against the ATen compositions
// they replace, on tensors far larger than the caches, in GB/s of the bytes the fused kernels
// must move (RMSNorm: read x, write y; read x, dy, write dx = 5 floats an element; SwiGLU: read
// gate/up, write h; read gate/up, dh, write d(gate/up) = 8 floats per output element) and as %
// of a bound measured first in the same binary: a parallel copy (read + write) of a 256 MiB
// buffer. Each fused row first checks itself against the ATen composition (relative 1e-5).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "longtrain/model/fused_ops.h"
#include "longtrain/model/model.h"

namespace {

using Op = std::function<std::vector<at::Tensor>(const at::Tensor& in, const at::Tensor& w, const at::Tensor& up)>;

double copyBandwidth() {
  static const double bw = [] {
    auto a = at::randn({int64_t{64} << 20}), b = at::empty_like(a);
    double best = 0;
    for (int i = 0; i < 5; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      b.copy_(a);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 2.0 * a.numel() * 4 / s);
    }
    return best;
  }();
  return bw;
}

std::vector<at::Tensor> rmsStep(bool fused, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& up) {
  auto x = x0.detach().requires_grad_(true), w = w0.detach().requires_grad_(true);
  auto y = fused ? lt::model::fusedRmsNorm(x, w, 1e-5) : lt::model::rmsNorm(x, w, 1e-5);
  y.backward(up);
  return {y.detach(), x.grad(), w.grad()};
}

std::vector<at::Tensor> swigluStep(bool fused, const at::Tensor& gu0, const at::Tensor&, const at::Tensor& up) {
  auto gu = gu0.detach().requires_grad_(true);
  const int64_t F = gu.size(-1) / 2;
  auto h = fused ? lt::model::fusedSwiglu(gu) : at::silu(gu.narrow(-1, 0, F)) * gu.narrow(-1, F, F);
  h.backward(up);
  return {h.detach(), gu.grad()};
}

void check(const Op& fused, const Op& ref, const at::Tensor& in, const at::Tensor& w, const at::Tensor& up,
           const char* name) {
  auto a = fused(in, w, up), b = ref(in, w, up);
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = (a[i] - b[i]).abs().max().item<double>() / b[i].abs().max().item<double>();
    if (e > 1e-5) {
      std::fprintf(stderr, "bench/pointwise: %s disagrees with ATen (tensor %zu, rel %.3g)\n", name, i, e);
      std::exit(1);
    }
  }
}

void run(benchmark::State& state, const std::string& kind, bool fused) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t rows = state.range(0), width = state.range(1);
  const bool rms = kind == "rmsnorm";
  auto in = rms ? at::randn({rows, width}, gen) : at::randn({rows, 2 * width}, gen);
  auto w = at::randn({width}, gen), up = at::randn({rows, width}, gen);
  Op f = [&](auto& a, auto& b, auto& c) { return rms ? rmsStep(true, a, b, c) : swigluStep(true, a, b, c); };
  Op r = [&](auto& a, auto& b, auto& c) { return rms ? rmsStep(false, a, b, c) : swigluStep(false, a, b, c); };
  if (fused) check(f, r, in, w, up, kind.c_str());
  for (auto _ : state) benchmark::DoNotOptimize(fused ? f(in, w, up) : r(in, w, up));
  const double bytes = (rms ? 5.0 : 8.0) * rows * width * 4;
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["%bound"] = benchmark::Counter(bytes / copyBandwidth() * 100, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  at::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));  // as a 1-rank run (train.threads 0)
  std::printf("threads %d, copy bandwidth (read + write) %.1f GB/s, kernels %s\n", at::get_num_threads(),
              copyBandwidth() * 1e-9, lt::model::kernelIsaName(lt::model::kernelBestIsa()));
  for (const char* kind : {"rmsnorm", "swiglu"})
    for (bool fused : {false, true}) {
      const std::string name = std::string(kind) + (fused ? "_fused" : "_aten");
      auto* b = benchmark::RegisterBenchmark(name.c_str(), [kind, fused](benchmark::State& s) { run(s, kind, fused); });
      b->Args({32768, kind[0] == 'r' ? 256 : 704})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
    }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
