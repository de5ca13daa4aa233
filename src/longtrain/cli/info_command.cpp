// `longtrain info`: what a run would get on this machine (CPU, BLAS kernel, allocator, threads,
// measured GEMM peaks, fused-kernel ISA) and whether its GEMMs compute right. Non-obvious: a
// wrong BLAS or oneDNN result is an error (exit 1) with the setting that avoids it.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "longtrain/cli/command.h"
#include "longtrain/core/check.h"
#include "longtrain/core/cpu.h"
#include "longtrain/core/memory.h"
#include "longtrain/kernels/fused_attention.h"
#include "longtrain/kernels/isa.h"
#include "longtrain/train/machine.h"
#include "longtrain/train/peak_record.h"

namespace lt::cli {

namespace {

// Each route's rate measured now, and the best this machine has recorded (what MFU is against).
void printGemmPeaks() {
  struct Route {
    kernels::GemmRoute route;
    const char* label;
    const char* what;
  };
  const Route routes[] = {
      {kernels::GemmRoute::Blas, "gemm peak", "fp32 through the BLAS"},
      {kernels::GemmRoute::OneDnn, "gemm peak onednn",
       "fp32, oneDNN's sgemm; model.gemm \"auto\" takes it on CPUs with AVX2 and FMA"},
      {kernels::GemmRoute::Bf16, "gemm peak bf16",
       "oneDNN's bf16 matmul, fp32 result; bf16.enabled uses it only where it is faster"}};
  for (const auto& r : routes) {
    const double now = train::measureGemmPeakFlops(r.route);
    const train::GemmPeak best = train::robustGemmPeak(r.route, now, 0);
    std::printf("%s: %.1f GFLOP/s (%s, 1024^3, best of several); MFU's peak: %.1f (%s)\n", r.label, now / 1e9, r.what,
                best.flops / 1e9, best.source.c_str());
  }
}

void checkGemms(const BlasKernelReport& blas) {
  const double err = train::gemmRelativeError();
  std::printf("gemm relative error: %.3g (against a double-precision loop; fp32 expects < 1e-5)\n", err);
  LT_CHECK(err < 1e-5, "the BLAS kernel ", blas.core, " computes wrong results here (relative error ", err,
           "); set OPENBLAS_CORETYPE to an older kernel (e.g. Haswell or Prescott)");
  const double oneDnnErr = train::gemmRelativeError(kernels::GemmRoute::OneDnn);
  std::printf("gemm relative error onednn: %.3g\n", oneDnnErr);
  LT_CHECK(oneDnnErr < 1e-5, "oneDNN's sgemm computes wrong results here (relative error ", oneDnnErr,
           "); set model.gemm=\"blas\"");
}

int runInfo(int threads) {
  at::set_num_threads(threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  const auto isa = cpuIsa();
  const auto blas = blasKernelReport();
  std::printf("cpu: %s%s\n", isa.name().c_str(), isa.amd ? " (AMD)" : "");
  std::printf("blas: core=%s  %s\n", blas.core.empty() ? "unknown" : blas.core.c_str(), blas.describe().c_str());
  if (const std::string c = blasConfig(); !c.empty()) std::printf("blas config: %s\n", c.c_str());
  std::printf("allocator: %s\n", allocatorName().c_str());
  std::printf("threads: %d\n", at::get_num_threads());
  printGemmPeaks();
  std::printf("fused kernels: %s (attention, RMSNorm, SwiGLU, the LM head's loss); bf16 attention products: %s\n",
              kernels::isaName(kernels::isaBest()), kernels::fusedAttentionBf16Engine());
  checkGemms(blas);
  return 0;
}

}  // namespace

Command infoCommand(CLI::App& app) {
  auto threads = std::make_shared<int>(0);
  auto* info = app.add_subcommand("info", "print the CPU, the BLAS kernel and allocator a run gets, the measured "
                                          "GEMM peak, and check the kernel's numerics");
  info->add_option("--threads", *threads, "intra-op threads (default: every core, as one rank trains)")
      ->check(CLI::Range(1, 1024));
  return {info, [threads] { return runInfo(*threads); }};
}

}  // namespace lt::cli
