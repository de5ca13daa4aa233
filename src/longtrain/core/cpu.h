// What this CPU can run, and whether the BLAS libtorch calls runs its best kernel for it.
// Non-obvious: OpenBLAS picks its kernel in its library constructor, before main, from the
// CPU model it knows; Debian's 0.3.21 does not know some new models and falls back to its
// SSE3 "Prescott" kernels (5x slower sgemm). The only fix is OPENBLAS_CORETYPE in the
// environment of a new process image, so `ensureStartEnvironment` re-executes the program once
// (a setenv from .preinit_array is too late: libc's constructor resets environ after it).
// No libtorch here: this runs before anything touches a tensor.
#pragma once
#include <cstdint>
#include <string>

namespace lt {

struct CpuIsa {
  bool avx2Fma = false;  // AVX2 and FMA, with the OS saving ymm state
  bool avx512 = false;   // AVX-512 F, BW, DQ and VL, with the OS saving zmm state
  bool amd = false;      // vendor AMD (OpenBLAS calls its AVX2 kernels "Zen" there)
  bool avx512Bf16 = false;  // avx512 and AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16)
  bool amxBf16 = false;     // avx512Bf16, AMX-TILE and AMX-BF16 (the OS's grant: amxTileStateGranted)
  std::string name() const;  // "avx512", "avx2", or "baseline"
};
CpuIsa cpuIsa();

// Linux hands a process the AMX tile state (8 KiB a thread) only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); before it, a tile instruction faults. Asks once,
// on the first call, so only a process that runs tile products asks at all.
bool amxTileStateGranted();

// Intra-op threads a rank runs: `asked` (train.threads) if positive, else this machine's cores
// shared among its `localRanks` ranks (at least 1).
int threadsPerRank(int asked, int localRanks);

// One core's L2 cache in bytes (sysconf, else /sys/devices/system/cpu/cpu0/cache/index2); 0 where
// neither says.
int64_t l2CacheBytes();

// The kernel ("core") name OpenBLAS chose in this process, as openblas_get_corename reports
// it ("SkylakeX", "Haswell", "Prescott", ...); "" when the BLAS is not OpenBLAS.
std::string blasCoreName();
// The BLAS library's own description (openblas_get_config), "" when unknown.
std::string blasConfig();

// The OPENBLAS_CORETYPE that would run this CPU's widest ISA, or "" when `current` already
// does (or the CPU has nothing better than SSE). Pure: tested on every CPU with tables.
//   AVX-512 F/BW/DQ/VL: SkylakeX (kept: SkylakeX, Cooperlake, SapphireRapids)
//   AVX2 + FMA:         Haswell, or Zen on AMD (kept: any of those or an AVX-512 core)
std::string betterBlasCore(const std::string& current, const CpuIsa& isa);

// What the start-up check found and did, for the banner and `longtrain info`.
struct BlasKernelReport {
  std::string core;        // the kernel this process runs
  std::string was;         // the kernel before longtrain re-executed with OPENBLAS_CORETYPE ("": no fix)
  bool userSet = false;    // OPENBLAS_CORETYPE came from the user's environment: kept as it is
  bool belowCpu = false;   // the kernel is below what the CPU supports, and nothing fixed it
  std::string describe() const;  // e.g. "OpenBLAS SkylakeX (fixed from Prescott)"
};

// At the top of main, before any BLAS call: sets, in the environment of a new image of this
// program (execv of /proc/self/exe with the same arguments, once: a marker variable stops a
// loop), what libraries read only in their constructors, before main:
//  - OPENBLAS_CORETYPE, when OpenBLAS runs a kernel below the CPU's ISA and the user set none;
//  - GOMP_SPINCOUNT=10000 when `shortOmpSpin` (training) and the user set neither it nor
//    OMP_WAIT_POLICY: libgomp's default has an idle thread spin ~300k pauses (~7 ms on Zen 2)
//    after each parallel region, which on a shared machine takes the cores from the working
//    threads (the quick start's ~100 regions a step: 2-3k tokens/s against 30-41k with 1000,
//    AMD EPYC Zen 2 at load 8-9); 10000 still catches a step's back-to-back regions.
// Returns only when no re-exec was needed or possible. Children (ranks) inherit the variables,
// so they start right without re-executing.
void ensureStartEnvironment(char** argv, bool shortOmpSpin);
BlasKernelReport blasKernelReport();

}  // namespace lt
