// Which build of the fused kernels this CPU runs; one definition for attention and the pointwise
// kernels, over core/cpu's cpuid + OS register-state check (as CPU Adam's dispatch uses).
#include "longtrain/model/kernel_isa.h"

#include "longtrain/core/cpu.h"

namespace lt::model {

KernelIsa kernelBestIsa() {
  static const KernelIsa best = kernelIsaSupported(KernelIsa::Avx512) ? KernelIsa::Avx512
                                : kernelIsaSupported(KernelIsa::Avx2) ? KernelIsa::Avx2
                                                                      : KernelIsa::Baseline;
  return best;
}

bool kernelIsaSupported(KernelIsa isa) {
  const CpuIsa cpu = cpuIsa();
  switch (isa) {
    case KernelIsa::Avx512: return cpu.avx512;
    case KernelIsa::Avx2: return cpu.avx2Fma;
    case KernelIsa::Baseline: return true;
  }
  return false;
}

const char* kernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return "avx512";
    case KernelIsa::Avx2: return "avx2";
    case KernelIsa::Baseline: return "baseline";
  }
  return "?";
}

}  // namespace lt::model
