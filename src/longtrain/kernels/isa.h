// Which build of the model's fused kernels (attention, RMSNorm, SwiGLU) runs: each is compiled
// for x86-64's baseline, AVX2 + FMA and AVX-512 F, and the widest this CPU supports is the default.
// Tests force each supported one to check it against the ATen reference.
#pragma once

namespace lt::model {

enum class KernelIsa { Baseline, Avx2, Avx512 };
KernelIsa kernelBestIsa();               // the widest build this CPU runs
bool kernelIsaSupported(KernelIsa isa);  // the baseline (SSE2) build always is
const char* kernelIsaName(KernelIsa isa);  // "baseline", "avx2", "avx512"

}  // namespace lt::model
