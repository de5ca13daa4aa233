// bench/attention: causal attention forward + backward (the fused forward also alone) at the long
// shape (seq 4096, 8 query heads, 4 kv heads, head dim 16; and head dim 32, 64 at seq 2048) for
// naive ATen attention, today's chunked path (tile 256), and the fused kernel per ISA this CPU runs
// (and its bf16 products where the CPU has AVX512_BF16: on vdpbf16ps, and on AMX tiles where it has
// those), each in GFLOP/s of causal-attention model
// FLOPs (6 S^2 D per head: six products of 2 S^2 D FLOPs, QK^T and PV forward and four backward,
// halved by the mask; the recomputed QK^T is not counted) and as % of the fp32 GEMM peak of the
// model's fastest fp32 route (oneDNN's sgemm or the BLAS), measured first in the same binary. Each
// fused row first checks its output and gradients against the naive path (relative 1e-5; the bf16
// row 2e-2, tests/testing.h's kBf16Attention) and aborts the bench if not. The fused_window512 row
// is Mistral's sliding window W = 512 (checked against naive with that window): its GFLOP/s count
// the causal FLOPs, so its rate over the causal row's is the time the skipped tiles save.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "longtrain/kernels/fused_attention.h"
#include "longtrain/model/attention.h"
#include "longtrain/model/model.h"
#include "longtrain/train/machine.h"

namespace {

using AttnFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

struct Inputs {
  at::Tensor q, k, v, up;
};

Inputs makeInputs(int64_t S, int64_t D) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  return {at::randn({1, S, 8, D}, gen).requires_grad_(true), at::randn({1, S, 4, D}, gen).requires_grad_(true),
          at::randn({1, S, 4, D}, gen).requires_grad_(true), at::randn({1, S, 8, D}, gen)};
}

std::vector<at::Tensor> step(Inputs& in, const AttnFn& fn) {
  for (auto* t : {&in.q, &in.k, &in.v}) t->mutable_grad() = at::Tensor();
  auto out = fn(in.q, in.k, in.v);
  (out * in.up).sum().backward();
  return {out.detach(), in.q.grad(), in.k.grad(), in.v.grad()};
}

double relErr(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

void checkAgainstNaive(Inputs& in, const AttnFn& fn, const std::string& name, double tolerance, int64_t window) {
  AttnFn naive = [window](auto& q, auto& k, auto& v) { return lt::model::slidingWindowAttention(q, k, v, {}, window); };
  auto ref = step(in, naive), got = step(in, fn);
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = relErr(got[i], ref[i]);
    if (e > tolerance) {
      std::fprintf(stderr, "bench/attention: %s disagrees with naive attention (tensor %zu, rel %.3g)\n", name.c_str(),
                   i, e);
      std::exit(1);
    }
  }
}

double gemmPeak() {
  static const double peak = std::max(lt::train::measureGemmPeakFlops(lt::kernels::GemmRoute::Blas),
                                      lt::train::measureGemmPeakFlops(lt::kernels::GemmRoute::OneDnn));
  return peak;
}

// tolerance < 0: no check (the reference rows themselves).
void run(benchmark::State& state, const AttnFn& fn, const std::string& name, double tolerance, int64_t window) {
  const int64_t S = state.range(0), D = state.range(1);
  auto in = makeInputs(S, D);
  if (tolerance >= 0) checkAgainstNaive(in, fn, name, tolerance, window);
  for (auto _ : state) benchmark::DoNotOptimize(step(in, fn));
  const double flops = 6.0 * 8 * S * static_cast<double>(S) * D;  // 8 query heads
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["%peak"] = benchmark::Counter(flops / gemmPeak() * 100, benchmark::Counter::kIsIterationInvariantRate);
}

// The backward alone in each plan (fused_attention.h, BackwardPlan) at seq 4096, head dim 16, 8
// query heads over `kv` kv heads, batch 1; the per-tile plan's gradients must equal the per-kv-head
// plan's bit for bit.
void backwardPlan(benchmark::State& state) {
  using lt::kernels::BackwardPlan;
  const int64_t S = 4096, D = 16, kv = state.range(0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  auto q = at::randn({1, S, 8, D}, gen), k = at::randn({1, S, kv, D}, gen), v = at::randn({1, S, kv, D}, gen);
  auto dout = at::randn({1, S, 8, D}, gen);
  lt::kernels::FusedAttentionOptions o;
  const auto fwd = lt::kernels::fusedAttentionForward(q, k, v, o);
  o.backwardPlan = BackwardPlan::PerKvHead;
  const auto ref = lt::kernels::fusedAttentionBackward(q, k, v, fwd, dout, o);
  o.backwardPlan = static_cast<BackwardPlan>(state.range(1));
  const auto got = lt::kernels::fusedAttentionBackward(q, k, v, fwd, dout, o);
  if (!got.dq.equal(ref.dq) || !got.dk.equal(ref.dk) || !got.dv.equal(ref.dv)) {
    std::fprintf(stderr, "bench/attention: the backward plans' gradients differ (kv %ld)\n", static_cast<long>(kv));
    std::exit(1);
  }
  for (auto _ : state) benchmark::DoNotOptimize(lt::kernels::fusedAttentionBackward(q, k, v, fwd, dout, o));
}

// The forward alone (the best ISA's fp32 build), at the fused rows' shapes: no check here, the
// fused rows check the same kernel.
void forwardOnly(benchmark::State& state) {
  const int64_t S = state.range(0), D = state.range(1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto q = at::randn({1, S, 8, D}, gen), k = at::randn({1, S, 4, D}, gen), v = at::randn({1, S, 4, D}, gen);
  for (auto _ : state) benchmark::DoNotOptimize(lt::kernels::fusedAttentionForward(q, k, v));
}

void registerAll() {
  auto* fwd = benchmark::RegisterBenchmark("forward", forwardOnly);
  for (auto [S, D] : {std::pair<int64_t, int64_t>{4096, 16}, {2048, 64}}) fwd->Args({S, D});
  fwd->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
  for (int64_t kv : {1, 2, 4})
    for (auto plan : {lt::kernels::BackwardPlan::PerKvHead, lt::kernels::BackwardPlan::PerTile})
      benchmark::RegisterBenchmark(plan == lt::kernels::BackwardPlan::PerTile ? "backward_per_tile" : "backward_per_kv_head",
                                   backwardPlan)
          ->Args({kv, static_cast<int64_t>(plan)})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(1.0);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 16}, {2048, 32}, {2048, 64}};
  auto add = [&](const std::string& name, AttnFn fn, double tolerance, int64_t window = 0, bool amxOff = false) {
    auto* b = benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
      lt::kernels::turnOffAmxForTesting(amxOff);
      run(s, fn, name, tolerance, window);
      lt::kernels::turnOffAmxForTesting(false);
    });
    for (auto [S, D] : shapes) b->Args({S, D});
    b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
  };
  add("naive", [](auto& q, auto& k, auto& v) { return lt::model::causalAttention(q, k, v); }, -1);
  add("chunked256", [](auto& q, auto& k, auto& v) { return lt::model::chunkedAttention(q, k, v, 256); }, -1);
  for (auto isa : {lt::kernels::Isa::Baseline, lt::kernels::Isa::Avx2, lt::kernels::Isa::Avx512}) {
    if (!lt::kernels::isaSupported(isa)) continue;
    lt::kernels::FusedAttentionOptions o;
    o.isa = isa;
    add(std::string("fused_") + lt::kernels::isaName(isa),
        [o](auto& q, auto& k, auto& v) { return lt::kernels::fusedAttention(q, k, v, o); }, 1e-5);
  }
  add("fused_window512", [](auto& q, auto& k, auto& v) {
    lt::kernels::FusedAttentionOptions o;
    o.documentStart = lt::model::firstVisibleKey({}, q.size(0), q.size(1), 512);
    return lt::kernels::fusedAttention(q, k, v, o);
  }, 1e-5, 512);
  if (lt::kernels::fusedAttentionBf16Supported()) {
    lt::kernels::FusedAttentionOptions o;
    o.isa = lt::kernels::Isa::Avx512Bf16;
    o.bf16 = true;
    add("fused_avx512_bf16", [o](auto& q, auto& k, auto& v) { return lt::kernels::fusedAttention(q, k, v, o); }, 2e-2,
        0, true);  // vdpbf16ps even on an AMX CPU
    if (lt::kernels::fusedAttentionBf16OnAmx())
      add("fused_amx_bf16", [o](auto& q, auto& k, auto& v) { return lt::kernels::fusedAttention(q, k, v, o); }, 2e-2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  at::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));  // as a 1-rank run (train.threads 0)
  std::printf("threads %d, fp32 GEMM peak %.1f GFLOP/s (the faster of the BLAS and oneDNN)\n", at::get_num_threads(),
              gemmPeak() * 1e-9);
  registerAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
