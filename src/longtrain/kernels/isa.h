// The one ISA enum of every CPU kernel family (attention, pointwise, CPU Adam): which build of a
// kernel runs. Each family is compiled once per ISA it has (CMake's longtrain_isa_sources) and
// dispatches at run time over core/cpu's cpuid + OS register-state check. Non-obvious: a family
// without a build for some ISA runs its widest build below it (isaAtMost), so Avx512Bf16 runs the
// fp32 kernels' Avx512 builds and only the bf16 attention products use their own.
#pragma once

namespace lt::kernels {

// Ordered: each ISA's instructions include the previous one's.
enum class Isa {
  Baseline,    // x86-64 (SSE2); CPU Adam's build here is its plain scalar reference
  Avx2,        // AVX2 + FMA
  Avx512,      // AVX-512 F, BW, DQ and VL
  Avx512Bf16,  // Avx512 and AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16)
};
constexpr Isa kIsas[] = {Isa::Baseline, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16};

Isa isaBest();                 // the widest ISA this CPU runs
bool isaSupported(Isa isa);    // the baseline always is
const char* isaName(Isa isa);  // "baseline", "avx2", "avx512", "avx512bf16"
// The widest of `builds` (ascending, starting with Baseline) not wider than isa: the build a
// family with those builds runs for isa.
template <class It>
constexpr Isa isaAtMost(Isa isa, It begin, It end) {
  Isa out = Isa::Baseline;
  for (It b = begin; b != end; ++b)
    if (*b <= isa) out = *b;
  return out;
}

}  // namespace lt::kernels
