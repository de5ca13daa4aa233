// bench/gemm_routes: the model's GEMMs on each route (kernels/gemm.h) at the medium e2e shape's
// products (4096 tokens, hidden 256, 8/4 heads, intermediate 704, vocab 1024; forward and the two
// backward forms), at the wide shape's (wide_*), and at 1024^3, in GFLOP/s. Routes: ATen's fp32
// (OpenBLAS, with whatever kernel OPENBLAS_CORETYPE pins), oneDNN's sgemm, and bf16 (oneDNN's
// matmul, fp32 result) three ways: on operands already bf16 (the kernel alone), on fp32 operands
// converted per call (what the model pays), and adding into the result (matmulAccumulate: the LM
// head's weight gradient). Non-obvious: each row first checks its product against a double-precision ATen matmul
// (fp32 routes: 1e-5 of the row's magnitude; bf16: against the bf16-rounded operands, 1e-5)
// and aborts the bench if it disagrees, so a fast wrong kernel cannot report a rate.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "longtrain/core/cpu.h"
#include "longtrain/kernels/gemm.h"

namespace {

using lt::kernels::GemmRoute;

struct Shape {
  const char* name;
  int64_t M, N, K;
  bool transA, transB;  // out [M, N] = op(a) op(b), as matmulInto takes them
};

// The medium shape's products: x W^T forward (transB), dy W for dx, dy^T x for dW (transA).
const std::vector<Shape> kShapes = {
    {"qkv_fwd", 4096, 512, 256, false, true},   {"qkv_dx", 4096, 256, 512, false, false},
    {"qkv_dw", 512, 256, 4096, true, false},    {"gateup_fwd", 4096, 1408, 256, false, true},
    {"down_fwd", 4096, 256, 704, false, true},  {"down_dw", 256, 704, 4096, true, false},
    {"head_fwd", 4096, 1024, 256, false, true}, {"square_1024", 1024, 1024, 1024, false, false},
    // The wide shape's (2048 tokens, hidden 1024, q/k/v 2048 wide, intermediate 2816, vocab 8192).
    {"wide_qkv_fwd", 2048, 2048, 1024, false, true},      {"wide_qkv_dx", 2048, 1024, 2048, false, false},
    {"wide_qkv_dw", 2048, 1024, 2048, true, false},       {"wide_gateup_fwd", 2048, 5632, 1024, false, true},
    {"wide_gateup_dw", 5632, 1024, 2048, true, false},    {"wide_down_fwd", 2048, 1024, 2816, false, true},
    {"wide_down_dx", 2048, 2816, 1024, false, false},     {"wide_head_fwd", 2048, 8192, 1024, false, true},
    {"wide_head_dw", 8192, 1024, 2048, true, false}};

enum class Mode { Blas, OneDnn, Bf16Kernel, Bf16Converting, Bf16Accumulate };
const char* modeName(Mode m) {
  switch (m) {
    case Mode::Blas: return "blas";
    case Mode::OneDnn: return "onednn";
    case Mode::Bf16Kernel: return "bf16_kernel";
    case Mode::Bf16Converting: return "bf16_with_conversion";
    case Mode::Bf16Accumulate: return "bf16_accumulate";
  }
  return "?";
}

void checkProduct(const Shape& s, Mode m, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  const bool bf16 = m != Mode::Blas && m != Mode::OneDnn;
  auto widen = [&](const at::Tensor& t) {
    return (bf16 ? t.to(at::kBFloat16) : t).to(at::kDouble);
  };
  const auto da = widen(a), db = widen(b);
  const auto want = at::mm(s.transA ? da.t() : da, s.transB ? db.t() : db);
  const double err = (out.to(at::kDouble) - want).abs().max().item<double>() / want.abs().max().item<double>();
  if (err > 1e-5) {
    std::fprintf(stderr, "bench/gemm_routes: %s on %s is wrong (relative %.3g)\n", s.name, modeName(m), err);
    std::exit(1);
  }
}

void run(benchmark::State& state, const Shape& s, Mode m) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const auto a = at::randn(s.transA ? at::IntArrayRef{s.K, s.M} : at::IntArrayRef{s.M, s.K}, gen);
  const auto b = at::randn(s.transB ? at::IntArrayRef{s.N, s.K} : at::IntArrayRef{s.K, s.N}, gen);
  const auto a16 = a.to(at::kBFloat16), b16 = b.to(at::kBFloat16);
  auto out = at::zeros({s.M, s.N});  // the accumulating modes' first product is then the product
  auto product = [&] {
    switch (m) {
      case Mode::Blas: return lt::kernels::matmulInto(out, a, s.transA, b, s.transB, GemmRoute::Blas);
      case Mode::OneDnn: return lt::kernels::matmulInto(out, a, s.transA, b, s.transB, GemmRoute::OneDnn);
      case Mode::Bf16Kernel: return lt::kernels::matmulInto(out, a16, s.transA, b16, s.transB, GemmRoute::Bf16);
      case Mode::Bf16Converting: return lt::kernels::matmulInto(out, a, s.transA, b, s.transB, GemmRoute::Bf16);
      case Mode::Bf16Accumulate: return lt::kernels::matmulAccumulate(out, a16, s.transA, b16, s.transB, GemmRoute::Bf16);
    }
  };
  product();
  checkProduct(s, m, a, b, out);
  for (auto _ : state) product();
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * s.M * s.N * s.K * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  at::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));  // as a 1-rank run (train.threads 0)
  std::printf("threads %d, %s\n", at::get_num_threads(), lt::blasKernelReport().describe().c_str());
  for (const auto& s : kShapes)
    for (Mode m : {Mode::Blas, Mode::OneDnn, Mode::Bf16Kernel, Mode::Bf16Converting, Mode::Bf16Accumulate}) {
      const std::string name = std::string(s.name) + "/" + modeName(m);
      benchmark::RegisterBenchmark(name.c_str(), [&s, m](benchmark::State& st) { run(st, s, m); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(0.3);
    }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
