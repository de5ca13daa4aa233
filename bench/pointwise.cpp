// bench/pointwise: fused RMSNorm and SwiGLU (forward + backward) against the ATen compositions
// they replace, on tensors far larger than the caches, in GB/s of the bytes the fused kernels
// must move (RMSNorm: read x, write y; read x, dy, write dx = 5 floats an element; SwiGLU: read
// gate/up, write h; read gate/up, dh, write d(gate/up) = 8 floats per output element) and as %
// of a bound measured first in the same binary: a parallel copy (read + write) of a 256 MiB
// buffer. Each fused row first checks itself against the ATen composition (relative 1e-5).
// The *_pass rows time each kernel pass alone (RoPE's too) on buffers it has written before, as
// a training step's are (it reuses its memory; the op rows allocate their outputs, which here
// page-faults), with a 256 MiB copy timed beside every pass: %bound there is the ratio of the sums.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "longtrain/kernels/fused_ops.h"
#include "longtrain/kernels/pointwise_kernels.h"
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
  auto y = fused ? lt::kernels::fusedRmsNorm(x, w, 1e-5) : lt::model::rmsNorm(x, w, 1e-5);
  y.backward(up);
  return {y.detach(), x.grad(), w.grad()};
}

std::vector<at::Tensor> swigluStep(bool fused, const at::Tensor& gu0, const at::Tensor&, const at::Tensor& up) {
  auto gu = gu0.detach().requires_grad_(true);
  const int64_t F = gu.size(-1) / 2;
  auto h = fused ? lt::kernels::fusedSwiglu(gu) : at::silu(gu.narrow(-1, 0, F)) * gu.narrow(-1, F, F);
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

template <class F>
double secondsOf(const F& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One kernel pass alone on buffers written before (as a training step's are: it reuses its memory),
// split over ATen's threads in 64-row chunks as fused_ops.cpp does; floats moved per element.
struct Pass {
  const char* name;
  double floatsPerElement;
};
constexpr Pass kPasses[] = {{"rmsnorm_fwd", 2}, {"rmsnorm_bwd", 3}, {"swiglu_fwd", 3}, {"swiglu_bwd", 5}, {"rope", 2}};

void runPass(benchmark::State& state, int which) {
  namespace pd = lt::kernels::pointwise_detail;
  static const pd::Kernels table[] = {pd::kernels_baseline(), pd::kernels_avx2(), pd::kernels_avx512()};
  constexpr lt::kernels::Isa kBuilds[] = {lt::kernels::Isa::Baseline, lt::kernels::Isa::Avx2, lt::kernels::Isa::Avx512};
  const pd::Kernels& k = table[static_cast<int>(lt::kernels::isaAtMost(lt::kernels::isaBest(), std::begin(kBuilds), std::end(kBuilds)))];
  const int64_t rows = state.range(0), width = state.range(1);  // width: D, F, or H x Dh for RoPE
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto a = at::randn({rows, 2 * width}, gen), b = at::randn({rows, 2 * width}, gen), c = at::randn({rows, width}, gen);
  auto w = at::randn({width}, gen), stat = at::rand({rows}, gen) + 0.5, acc = at::zeros({(rows + 63) / 64, width});
  auto cs = at::rand({rows, 32}, gen), sn = at::rand({rows, 32}, gen);  // RoPE: Dh 64, H = width / 64
  const float *ap = a.data_ptr<float>(), *cp = c.data_ptr<float>(), *wp = w.data_ptr<float>();
  float *bp = b.data_ptr<float>(), *sp = stat.data_ptr<float>(), *accp = acc.data_ptr<float>();
  auto pass = [&](int64_t r0, int64_t n) {
    switch (which) {
      case 0: return k.rmsNormForward(ap + r0 * width, wp, bp + r0 * width, sp + r0, n, width, 1e-5f);
      case 1: return k.rmsNormBackward(ap + r0 * width, wp, sp + r0, cp + r0 * width, bp + r0 * width,
                                       accp + r0 / 64 * width, n, width);
      case 2: return k.swigluForward(ap + r0 * 2 * width, bp + r0 * width, nullptr, n, width);
      case 3: return k.swigluBackward(ap + r0 * 2 * width, cp + r0 * width, bp + r0 * 2 * width, n, width);
      default: return k.rope(ap + r0 * width, width, cs.data_ptr<float>() + r0 * 32, sn.data_ptr<float>() + r0 * 32,
                             bp + r0 * width, n, width / 64, 32, 1.0f);
    }
  };
  auto sweep = [&] {
    at::parallel_for(0, (rows + 63) / 64, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) pass(ch * 64, std::min(rows, ch * 64 + 64) - ch * 64);
    });
  };
  sweep();  // touch every output page once
  // This machine's bandwidth drifts by 1.5x within minutes (shared host): each iteration times a
  // 256 MiB copy next to the kernel, and %bound compares the two sums.
  static auto copyFrom = at::randn({int64_t{64} << 20}), copyTo = at::empty_like(copyFrom);
  const double bytes = kPasses[which].floatsPerElement * rows * width * 4;
  double kernelSeconds = 0, boundSeconds = 0;
  for (auto _ : state) {
    const double copy = secondsOf([&] { copyTo.copy_(copyFrom); });
    const double kernel = secondsOf(sweep);
    state.SetIterationTime(kernel);
    kernelSeconds += kernel;
    boundSeconds += bytes / (2.0 * copyFrom.numel() * 4 / copy);
  }
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["%bound"] = benchmark::Counter(boundSeconds / kernelSeconds * 100);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  at::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));  // as a 1-rank run (train.threads 0)
  std::printf("threads %d, copy bandwidth (read + write) %.1f GB/s, kernels %s\n", at::get_num_threads(),
              copyBandwidth() * 1e-9, lt::kernels::isaName(lt::kernels::isaBest()));
  for (const char* kind : {"rmsnorm", "swiglu"})
    for (bool fused : {false, true}) {
      const std::string name = std::string(kind) + (fused ? "_fused" : "_aten");
      auto* b = benchmark::RegisterBenchmark(name.c_str(), [kind, fused](benchmark::State& s) { run(s, kind, fused); });
      b->Args({32768, kind[0] == 'r' ? 256 : 704})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
    }
  for (int p = 0; p < 5; ++p) {
    auto* b = benchmark::RegisterBenchmark((std::string(kPasses[p].name) + "_pass").c_str(),
                                           [p](benchmark::State& s) { runPass(s, p); });
    b->Args({32768, p < 2 ? 256 : p < 4 ? 704 : 512})->Unit(benchmark::kMillisecond)->UseManualTime()->MinTime(1.0);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
