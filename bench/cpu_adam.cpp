// bench/cpu_adam: one Adam step on 64M fp32 parameters with 1 and 2 threads (our best kernel,
// our scalar kernel, torch::optim::AdamW), each also a fraction of two bandwidth references run
// first in the same binary. Non-obvious: the triad counts 16 B/element (with write-allocate).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <c10/util/string_utils.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "longtrain/offload/cpu_adam.h"

namespace {

using lt::offload::AdamIsa;
using lt::offload::AdamParams;

constexpr int64_t kParams = int64_t{64} << 20;
// Adam, and the in-place read-modify-write reference (p += g; m += g; v += g) that has Adam's
// access pattern without its arithmetic: read p, g, m, v; write p, m, v.
constexpr double kAdamBytes = 28;
// STREAM triad a = b + s*c: read b, c; write a, plus the write-allocate read of a that plain
// stores cause. STREAM's own convention (12 B) is reported too, as GB/s_stream. On CPUs where
// in-place updates stream faster than cold stores, the RMW reference is the tighter ceiling.
constexpr double kTriadBytes = 16;
constexpr double kTriadStreamBytes = 12;
constexpr int64_t kBlock = 16;  // fixed inner trip count: GCC vectorizes it at -O2

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer allocFloats(int64_t n) {
  Buffer b(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float))));
  if (!b) std::abort();
  return b;
}

// fn(begin, end) over `threads` contiguous 64-aligned chunks; the caller takes the first.
template <class Fn>
void parallelFor(int64_t n, int threads, const Fn& fn) {
  const int64_t chunk = ((n + threads - 1) / threads + 63) / 64 * 64;
  std::vector<std::jthread> ts;
  for (int64_t b = chunk; b < n; b += chunk) {
    ts.emplace_back([&fn, b, e = std::min(n, b + chunk)] { fn(b, e); });
  }
  fn(0, std::min(n, chunk));
}

// Deterministic values in [-1, 1) without a generator's cost.
void fill(float* x, int64_t n, uint32_t seed, float scale, int threads) {
  parallelFor(n, threads, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint32_t h = static_cast<uint32_t>(i) * 2654435761u + seed;
      h ^= h >> 15;
      h *= 2246822519u;
      h ^= h >> 13;
      x[i] = scale * (static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
  });
}

bool allFinite(const float* x, int64_t n) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= std::isfinite(x[i]);
  return ok;
}

// The Adam arrays, shared by every Adam benchmark and reset before each.
struct AdamArrays {
  Buffer p = allocFloats(kParams), g = allocFloats(kParams), m = allocFloats(kParams),
         v = allocFloats(kParams);
  void reset() {
    fill(p.get(), kParams, 1, 1.0f, 2);
    fill(g.get(), kParams, 2, 0.1f, 2);
    fill(m.get(), kParams, 3, 0.0f, 2);
    fill(v.get(), kParams, 4, 0.0f, 2);
  }
  static AdamArrays& get() {
    static AdamArrays a;
    return a;
  }
};

// Chunks from parallelFor are multiples of 64 elements and kParams is too, so blocks are whole.
// The references get the widest vectors the CPU has, like our best kernel: on a single core the
// load width matters (measured on a Zen 3 VM: in-place RMW 17 GB/s with SSE, 19.6 with AVX2).
#define LT_BENCH_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
LT_BENCH_VECTOR_CLONES
void triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
           int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; i += kBlock)
    for (int64_t j = i; j < i + kBlock; ++j) a[j] = b[j] + s * c[j];
}

LT_BENCH_VECTOR_CLONES
void rmw(float* __restrict p, const float* __restrict g, float* __restrict m,
         float* __restrict v, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; i += kBlock) {
    for (int64_t j = i; j < i + kBlock; ++j) {
      p[j] += g[j];
      m[j] += g[j];
      v[j] += g[j];
    }
  }
}

// Results of the reference rows, by thread count.
std::map<int, double> triadGBps;  // 16 B/element
std::map<int, double> rmwGBps;    // 28 B/element
std::map<int, double> torchGparamps;

AdamParams benchParams() {
  AdamParams a;
  a.lr = 1e-3f;
  a.weightDecay = 0.01f;
  return a;
}

using Clock = std::chrono::steady_clock;

template <class Step>
double timeIterations(benchmark::State& state, const Step& step) {
  double total = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    step();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(s);
    total += s;
  }
  return total;
}

void reportAdam(benchmark::State& state, double seconds, int threads, bool finite,
                bool isTorch = false) {
  if (!finite) {
    state.SkipWithError("non-finite values in p, m or v after the steps");
    return;
  }
  const double params = static_cast<double>(kParams) * state.iterations();
  const double gparams = params / seconds / 1e9;
  const double gbps = params * kAdamBytes / seconds / 1e9;
  state.counters["Gparam/s"] = gparams;
  state.counters["GB/s"] = gbps;
  if (triadGBps.count(threads)) state.counters["of_triad"] = gbps / triadGBps[threads];
  if (rmwGBps.count(threads)) state.counters["of_rmw"] = gbps / rmwGBps[threads];
  if (!isTorch && torchGparamps.count(threads)) {
    state.counters["x_torch"] = gparams / torchGparamps[threads];
  }
}

void BM_Triad(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Buffer a = allocFloats(kParams), b = allocFloats(kParams), c = allocFloats(kParams);
  fill(a.get(), kParams, 5, 0.0f, threads);
  fill(b.get(), kParams, 6, 1.0f, threads);
  fill(c.get(), kParams, 7, 1.0f, threads);
  const float s = 2.0f;  // a power of two: s*c is exact, so an fma rounds like mul+add
  float* pa = a.get();
  const float* pb = b.get();
  const float* pc = c.get();
  const double seconds = timeIterations(state, [&] {
    parallelFor(kParams, threads, [&](int64_t lo, int64_t hi) { triad(pa, pb, pc, s, lo, hi); });
    benchmark::ClobberMemory();
  });
  for (int64_t i = 0; i < kParams; ++i) {
    if (pa[i] != pb[i] + s * pc[i]) {
      state.SkipWithError("triad result differs from b + s*c");
      return;
    }
  }
  const double elems = static_cast<double>(kParams) * state.iterations();
  triadGBps[threads] = elems * kTriadBytes / seconds / 1e9;
  state.counters["Gelem/s"] = elems / seconds / 1e9;
  state.counters["GB/s"] = triadGBps[threads];
  state.counters["GB/s_stream"] = elems * kTriadStreamBytes / seconds / 1e9;
}

void BM_InPlaceRmw(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  AdamArrays& arr = AdamArrays::get();
  // p = m = v = 0 and g = 1: after k iterations every value is exactly k.
  fill(arr.p.get(), kParams, 1, 0.0f, 2);
  fill(arr.m.get(), kParams, 1, 0.0f, 2);
  fill(arr.v.get(), kParams, 1, 0.0f, 2);
  parallelFor(kParams, 2, [&](int64_t lo, int64_t hi) {
    std::fill(arr.g.get() + lo, arr.g.get() + hi, 1.0f);
  });
  const double seconds = timeIterations(state, [&] {
    parallelFor(kParams, threads, [&](int64_t lo, int64_t hi) {
      rmw(arr.p.get(), arr.g.get(), arr.m.get(), arr.v.get(), lo, hi);
    });
    benchmark::ClobberMemory();
  });
  const float k = static_cast<float>(state.iterations());
  for (int64_t i = 0; i < kParams; ++i) {
    if (arr.p[i] != k || arr.m[i] != k || arr.v[i] != k) {
      state.SkipWithError("read-modify-write result differs from the iteration count");
      return;
    }
  }
  const double elems = static_cast<double>(kParams) * state.iterations();
  rmwGBps[threads] = elems * kAdamBytes / seconds / 1e9;
  state.counters["Gelem/s"] = elems / seconds / 1e9;
  state.counters["GB/s"] = rmwGBps[threads];
}

void BM_TorchAdamW(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  at::set_num_threads(threads);
  AdamArrays& arr = AdamArrays::get();
  arr.reset();
  const AdamParams a = benchParams();
  at::Tensor p = at::from_blob(arr.p.get(), {kParams});
  p.set_requires_grad(true);
  p.mutable_grad() = at::from_blob(arr.g.get(), {kParams});
  torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(a.lr)
                                   .betas(std::make_tuple(double{a.beta1}, double{a.beta2}))
                                   .eps(a.eps)
                                   .weight_decay(a.weightDecay));
  opt.step();  // allocates m and v outside the timed steps
  const double seconds = timeIterations(state, [&] { opt.step(); });
  auto& st = static_cast<torch::optim::AdamWParamState&>(
      *opt.state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
  const bool finite = allFinite(arr.p.get(), kParams) &&
                      st.exp_avg().isfinite().all().item<bool>() &&
                      st.exp_avg_sq().isfinite().all().item<bool>();
  reportAdam(state, seconds, threads, finite, /*isTorch=*/true);
  if (finite) torchGparamps[threads] = state.counters["Gparam/s"];
}

void runOurs(benchmark::State& state, AdamIsa isa) {
  const int threads = static_cast<int>(state.range(0));
  AdamArrays& arr = AdamArrays::get();
  arr.reset();
  const AdamParams a = benchParams();
  int64_t step = 0;
  const double seconds = timeIterations(state, [&] {
    lt::offload::adamStepWith(isa, arr.p.get(), arr.g.get(), arr.m.get(), arr.v.get(), kParams,
                              ++step, a, threads);
  });
  const bool finite = allFinite(arr.p.get(), kParams) && allFinite(arr.m.get(), kParams) &&
                      allFinite(arr.v.get(), kParams);
  reportAdam(state, seconds, threads, finite);
}

void BM_OursScalar(benchmark::State& state) { runOurs(state, AdamIsa::AdamIsaScalar); }
void BM_OursBest(benchmark::State& state) { runOurs(state, lt::offload::adamBestIsa()); }

// Registration order is run order: the references and libtorch first, so later rows relate to
// them. Manual time: each iteration is timed by itself, and that time gives the counters.
void perThreadCount(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_Triad)->Apply(perThreadCount);
BENCHMARK(BM_InPlaceRmw)->Apply(perThreadCount);
BENCHMARK(BM_TorchAdamW)->Apply(perThreadCount);
BENCHMARK(BM_OursScalar)->Apply(perThreadCount);
BENCHMARK(BM_OursBest)->Apply(perThreadCount);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("adam_isa", lt::offload::adamIsa());
  benchmark::AddCustomContext("params", std::to_string(kParams));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
