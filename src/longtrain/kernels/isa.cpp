// Which build of the CPU kernels this CPU runs: one definition for every kernel family, over
// core/cpu's cpuid + OS register-state check. Non-obvious: the names are what `longtrain info`,
// the benches and the tests print, so they stay the lower-case ISA names users know.
#include "longtrain/kernels/isa.h"

#include "longtrain/core/cpu.h"

namespace lt::kernels {

Isa isaBest() {
  static const Isa best = [] {
    Isa out = Isa::Baseline;
    for (Isa isa : kIsas)
      if (isaSupported(isa)) out = isa;
    return out;
  }();
  return best;
}

bool isaSupported(Isa isa) {
  const CpuIsa cpu = cpuIsa();
  switch (isa) {
    case Isa::Avx512Bf16: return cpu.avx512Bf16;
    case Isa::Avx512: return cpu.avx512;
    case Isa::Avx2: return cpu.avx2Fma;
    case Isa::Baseline: return true;
  }
  return false;
}

const char* isaName(Isa isa) {
  switch (isa) {
    case Isa::Avx512Bf16: return "avx512bf16";
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    case Isa::Baseline: return "baseline";
  }
  return "?";
}

}  // namespace lt::kernels
