// bench/cpu_adam: one Adam step on 64M fp32 parameters with 1 and 2 threads (each of our kernels
// this CPU runs, and torch::optim::AdamW), each as a percentage of the in-place read-modify-write
// bound measured first in the same binary, on the same buffers and thread count; and the step
// that also writes a bf16 copy of the master (ZeRO's bf16 gathers), its 2 more bytes per
// parameter counted (30 B against the bound's 28, so it can pass 100%). Non-obvious: the
// Adam and RMW rows also run on transparent huge pages, which move the bound itself by ~10%, so a
// percentage is only meaningful against the bound of the same page size.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <c10/util/string_utils.h>
#include <sys/mman.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "longtrain/core/torch_compat.h"
#include "longtrain/kernels/cpu_adam.h"

namespace {

using lt::kernels::Isa;
using lt::kernels::AdamParams;

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
constexpr size_t kHugePage = size_t{2} << 20;
// Result check: each kernel against the scalar one on a slice big enough that the library splits
// it across the threads (its minimum is 64K elements per thread) and not a multiple of any
// vector width.
constexpr int64_t kCheckParams = (int64_t{1} << 20) + 37;
constexpr int kCheckSteps = 3;
constexpr double kCheckTol = 1e-6;  // |p - p_scalar|, unit-scale data (tests/kernels_cpu_adam_test)

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

// 2 MiB-aligned, so a huge-page request covers the whole buffer; pages are touched by fill().
Buffer allocFloats(int64_t n, bool hugePages = false) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + kHugePage - 1) / kHugePage * kHugePage;
  Buffer b(static_cast<float*>(std::aligned_alloc(kHugePage, bytes)));
  if (!b) std::abort();
  if (hugePages) madvise(b.get(), bytes, MADV_HUGEPAGE);  // a hint: without THP it stays 4 KiB
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

// The Adam arrays, one set per page size, shared by the Adam and RMW rows and reset before each.
struct AdamArrays {
  explicit AdamArrays(bool huge)
      : p(allocFloats(kParams, huge)), g(allocFloats(kParams, huge)), m(allocFloats(kParams, huge)),
        v(allocFloats(kParams, huge)) {}
  Buffer p, g, m, v;
  Buffer copy;  // kParams bf16 values (half as many floats' bytes), allocated on first use
  uint16_t* bf16Copy() {
    if (!copy) copy = allocFloats(kParams / 2);
    return reinterpret_cast<uint16_t*>(copy.get());
  }
  void reset() {
    fill(p.get(), kParams, 1, 1.0f, 2);
    fill(g.get(), kParams, 2, 0.1f, 2);
    fill(m.get(), kParams, 3, 0.0f, 2);
    fill(v.get(), kParams, 4, 0.0f, 2);
  }
  static AdamArrays& get(bool huge) {  // each set allocated on first use
    if (huge) {
      static AdamArrays large(true);
      return large;
    }
    static AdamArrays small(false);
    return small;
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

// Results of the reference rows: the triad and libtorch by thread count, the RMW bound by
// (thread count, huge pages).
std::map<int, double> triadGBps;  // 16 B/element
std::map<std::pair<int, bool>, double> rmwGBps;  // 28 B/element
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

int threadsOf(const benchmark::State& state) { return static_cast<int>(state.range(0)); }
bool hugeOf(const benchmark::State& state) { return state.range(1) != 0; }

void reportAdam(benchmark::State& state, double seconds, bool isTorch = false, double bytes = kAdamBytes) {
  const int threads = threadsOf(state);
  const double params = static_cast<double>(kParams) * state.iterations();
  const double gparams = params / seconds / 1e9;
  const double gbps = params * bytes / seconds / 1e9;
  state.counters["Gparam/s"] = gparams;
  state.counters["GB/s"] = gbps;
  const auto bound = rmwGBps.find({threads, hugeOf(state)});
  if (bound != rmwGBps.end()) {
    state.counters["bound_GB/s"] = bound->second;
    state.counters["pct_of_bound"] = 100 * gbps / bound->second;
  }
  if (triadGBps.count(threads)) state.counters["of_triad"] = gbps / triadGBps[threads];
  if (!isTorch && torchGparamps.count(threads)) {
    state.counters["x_torch"] = gparams / torchGparamps[threads];
  }
}

void BM_Triad(benchmark::State& state) {
  const int threads = threadsOf(state);
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
  const int threads = threadsOf(state);
  AdamArrays& arr = AdamArrays::get(hugeOf(state));
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
  rmwGBps[{threads, hugeOf(state)}] = elems * kAdamBytes / seconds / 1e9;
  state.counters["Gelem/s"] = elems / seconds / 1e9;
  state.counters["GB/s"] = rmwGBps[{threads, hugeOf(state)}];
}

void BM_TorchAdamW(benchmark::State& state) {
  const int threads = threadsOf(state);
  at::set_num_threads(threads);
  AdamArrays& arr = AdamArrays::get(hugeOf(state));
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
      *opt.state().at(lt::compat::optimizerStateKey(p)));
  if (!allFinite(arr.p.get(), kParams) || !st.exp_avg().isfinite().all().item<bool>() ||
      !st.exp_avg_sq().isfinite().all().item<bool>()) {
    state.SkipWithError("non-finite values in p, m or v after the steps");
    return;
  }
  reportAdam(state, seconds, /*isTorch=*/true);
  torchGparamps[threads] = state.counters["Gparam/s"];
}

// max |p - p_scalar| after kCheckSteps steps from the benchmark's start values, with `threads`
// threads; infinity if any of p, m, v is not finite.
double diffFromScalar(Isa isa, int threads) {
  const AdamParams a = benchParams();
  std::vector<float> g(kCheckParams);
  fill(g.data(), kCheckParams, 2, 0.1f, 1);
  std::vector<float> p[2], m[2], v[2];
  const Isa isas[2] = {isa, Isa::Baseline};
  for (int k = 0; k < 2; ++k) {
    p[k].resize(kCheckParams);
    fill(p[k].data(), kCheckParams, 1, 1.0f, 1);
    m[k].assign(kCheckParams, 0.0f);
    v[k].assign(kCheckParams, 0.0f);
    for (int s = 1; s <= kCheckSteps; ++s) {
      lt::kernels::adamStepWith(isas[k], p[k].data(), g.data(), m[k].data(), v[k].data(),
                                kCheckParams, s, a, k == 0 ? threads : 1);
    }
  }
  if (!allFinite(p[0].data(), kCheckParams) || !allFinite(m[0].data(), kCheckParams) ||
      !allFinite(v[0].data(), kCheckParams)) {
    return INFINITY;
  }
  double worst = 0;
  for (int64_t i = 0; i < kCheckParams; ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(p[0][i]) - p[1][i]));
  }
  return worst;
}

void BM_Ours(benchmark::State& state, Isa isa) {
  const int threads = threadsOf(state);
  AdamArrays& arr = AdamArrays::get(hugeOf(state));
  arr.reset();  // also the first touch of every page, before the timed steps
  const AdamParams a = benchParams();
  int64_t step = 0;
  const double seconds = timeIterations(state, [&] {
    lt::kernels::adamStepWith(isa, arr.p.get(), arr.g.get(), arr.m.get(), arr.v.get(), kParams,
                              ++step, a, threads);
  });
  if (!allFinite(arr.p.get(), kParams) || !allFinite(arr.m.get(), kParams) ||
      !allFinite(arr.v.get(), kParams)) {
    state.SkipWithError("non-finite values in p, m or v after the steps");
    return;
  }
  const double diff = diffFromScalar(isa, threads);
  if (!(diff <= kCheckTol)) {
    state.SkipWithError("p differs from the scalar kernel's by more than 1e-6");
    return;
  }
  state.counters["max_diff_vs_scalar"] = diff;
  reportAdam(state, seconds);
}

// The step with a bf16 copy of the master (adamStepBf16 with pMaster): the master must equal the
// fp32 kernel's bit for bit and the copy be its rounding (c10::BFloat16's), checked on a slice.
bool bf16CopyMatches(Isa isa, int threads) {
  const AdamParams a = benchParams();
  const int64_t n = kCheckParams;
  std::vector<float> g(n), p[2], m[2], v[2];
  std::vector<uint16_t> copy(n);
  fill(g.data(), n, 2, 0.1f, 1);
  for (int k = 0; k < 2; ++k) {
    p[k].resize(n);
    fill(p[k].data(), n, 1, 1.0f, 1);
    m[k].assign(n, 0.0f);
    v[k].assign(n, 0.0f);
  }
  for (int s = 1; s <= kCheckSteps; ++s) {
    lt::kernels::adamStepBf16With(isa, copy.data(), p[0].data(), g.data(), m[0].data(), v[0].data(), n, s, a, threads);
    lt::kernels::adamStepWith(isa, p[1].data(), g.data(), m[1].data(), v[1].data(), n, s, a, threads);
  }
  for (int64_t i = 0; i < n; ++i)
    if (p[0][i] != p[1][i] || m[0][i] != m[1][i] || v[0][i] != v[1][i] || copy[i] != c10::BFloat16(p[1][i]).x)
      return false;
  return true;
}

void BM_OursBf16Copy(benchmark::State& state, Isa isa) {
  const int threads = threadsOf(state);
  AdamArrays& arr = AdamArrays::get(hugeOf(state));
  arr.reset();
  uint16_t* copy = arr.bf16Copy();
  const AdamParams a = benchParams();
  int64_t step = 0;
  const double seconds = timeIterations(state, [&] {
    lt::kernels::adamStepBf16With(isa, copy, arr.p.get(), arr.g.get(), arr.m.get(), arr.v.get(), kParams, ++step, a,
                                  threads);
  });
  if (!allFinite(arr.p.get(), kParams) || !bf16CopyMatches(isa, threads)) {
    state.SkipWithError("the bf16-copy step's master, m, v or copy differ from the fp32 step and its rounding");
    return;
  }
  reportAdam(state, seconds, /*isTorch=*/false, kAdamBytes + 2);
}

// Manual time: each iteration is timed by itself, and that time gives the counters.
void perThreadCount(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMillisecond);
}
// The same on 4 KiB and 2 MiB pages (huge:0/1), for the rows whose bound depends on them.
void perThreadCountAndPages(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "huge"})->ArgsProduct({{1, 2}, {0, 1}})->UseManualTime()->Unit(
      benchmark::kMillisecond);
}
// The slow rows (libtorch's unfused ops, our scalar kernel) only on 4 KiB pages.
void perThreadCountSmallPages(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "huge"})->ArgsProduct({{1, 2}, {0}})->UseManualTime()->Unit(
      benchmark::kMillisecond);
}

// Registration order is run order: the references and libtorch first, so later rows relate to
// them; then every kernel this CPU runs, fastest last.
void registerAll() {
  benchmark::RegisterBenchmark("BM_Triad", BM_Triad)->Apply(perThreadCount);
  benchmark::RegisterBenchmark("BM_InPlaceRmw", BM_InPlaceRmw)->Apply(perThreadCountAndPages);
  benchmark::RegisterBenchmark("BM_TorchAdamW", BM_TorchAdamW)->Apply(perThreadCountSmallPages);
  for (Isa isa : {Isa::Baseline, Isa::Avx2, Isa::Avx512}) {
    if (!lt::kernels::isaSupported(isa)) continue;
    const std::string name = std::string("BM_Ours_") + lt::kernels::isaName(isa);
    benchmark::RegisterBenchmark(name.c_str(), BM_Ours, isa)
        ->Apply(isa == Isa::Baseline ? perThreadCountSmallPages : perThreadCountAndPages);
  }
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (!lt::kernels::isaSupported(isa)) continue;
    const std::string name = std::string("BM_Ours_bf16_copy_") + lt::kernels::isaName(isa);
    benchmark::RegisterBenchmark(name.c_str(), BM_OursBf16Copy, isa)->Apply(perThreadCountSmallPages);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  registerAll();
  benchmark::AddCustomContext("adam_isa", lt::kernels::isaName(lt::kernels::isaBest()));
  benchmark::AddCustomContext("params", std::to_string(kParams));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
