// CPU features through GCC's cpuid wrapper (which also checks XCR0, i.e. that the OS saves
// the wide registers), and OpenBLAS's kernel choice through dlsym: libtorch links the
// generic libblas.so.3, which may or may not be OpenBLAS, so nothing links it by name.
#include "longtrain/core/cpu.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace lt {

namespace {

constexpr const char* kReexecMarker = "LONGTRAIN_BLAS_REEXEC_FROM";  // value: the kernel before, or ""
// 10000: on a quiet Intel Xeon (model 167) the quick start ran 19% faster than with 1000 (the
// idle thread still spinning when the next region starts), and under 6 busy loops on 2 cores
// as fast; 20000-30000 lost 20-30% there (performance.md, "Small shapes and OpenMP threads").
constexpr const char* kShortOmpSpinCount = "10000";

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// 2: an AVX-512 kernel, 1: an AVX2 kernel, 0: anything older (SSE, AVX1, Bulldozer family).
int coreTier(const std::string& core) {
  const std::string c = lower(core);
  for (const char* k : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == k) return 2;
  for (const char* k : {"haswell", "zen"})
    if (c == k) return 1;
  return 0;
}

const char* symbolString(const char* name) {
  using Fn = char* (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  return fn ? fn() : nullptr;
}

}  // namespace

bool amxTileStateGranted() {
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

std::string CpuIsa::name() const { return avx512 ? "avx512" : avx2Fma ? "avx2" : "baseline"; }

CpuIsa cpuIsa() {
  __builtin_cpu_init();
  CpuIsa isa;
  isa.avx2Fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  isa.avx512 = isa.avx2Fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  isa.avx512Bf16 = isa.avx512 && __builtin_cpu_supports("avx512bf16");
  isa.amxBf16 = isa.avx512Bf16 && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16");
  isa.amd = __builtin_cpu_is("amd");
  return isa;
}

std::string blasCoreName() {
  const char* s = symbolString("openblas_get_corename");
  if (!s) return "";
  std::string out(s);
  out.erase(std::find_if(out.rbegin(), out.rend(), [](char c) { return !std::isspace(static_cast<unsigned char>(c)); }).base(),
            out.end());
  return out;
}

std::string blasConfig() {
  const char* s = symbolString("openblas_get_config");
  return s ? std::string(s) : "";
}

std::string betterBlasCore(const std::string& current, const CpuIsa& isa) {
  const int want = isa.avx512 ? 2 : isa.avx2Fma ? 1 : 0;
  if (coreTier(current) >= want) return "";
  return want == 2 ? "SkylakeX" : isa.amd ? "Zen" : "Haswell";
}

std::string BlasKernelReport::describe() const {
  if (core.empty()) return "not OpenBLAS (kernel unknown)";
  std::string s = "OpenBLAS " + core;
  if (!was.empty()) s += " (fixed from " + was + ")";
  else if (userSet) s += " (OPENBLAS_CORETYPE from the environment)";
  if (belowCpu) s += " [below this CPU's " + cpuIsa().name() + ": sgemm runs several times slower]";
  return s;
}

BlasKernelReport blasKernelReport() {
  BlasKernelReport r;
  r.core = blasCoreName();
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const char* was = std::getenv(kReexecMarker);
  if (was && *was) r.was = was;
  r.userSet = user && *user && r.was.empty();
  r.belowCpu = !r.core.empty() && !betterBlasCore(r.core, cpuIsa()).empty();
  return r;
}

// The kernel to set in OPENBLAS_CORETYPE, or "" when this one is right or the user chose.
std::string blasFix(std::string& core) {
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  if (user && *user) return "";  // the user's choice stands (some CPUs need it to compute right)
  // LONGTRAIN_FAULT_BLAS_CORE (tests): pretend OpenBLAS chose this kernel, so the re-exec
  // path runs on CPUs that OpenBLAS already knows.
  const char* pretend = std::getenv("LONGTRAIN_FAULT_BLAS_CORE");
  core = pretend && *pretend ? pretend : blasCoreName();
  return core.empty() ? "" : betterBlasCore(core, cpuIsa());
}

void ensureStartEnvironment(char** argv, bool shortOmpSpin) {
  if (std::getenv(kReexecMarker)) return;  // this image is the re-executed one
  std::string core;
  const std::string better = blasFix(core);
  const bool spin = shortOmpSpin && !std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT");
  if (better.empty() && !spin) return;
  if (!better.empty()) ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  if (spin) ::setenv("GOMP_SPINCOUNT", kShortOmpSpinCount, 1);
  ::setenv(kReexecMarker, better.empty() ? "" : core.c_str(), 1);
  std::fflush(nullptr);
  ::execv("/proc/self/exe", argv);
  // execv failed (no /proc): carry on with the slow kernel and libgomp's spin; the banner says so.
  if (!better.empty()) ::unsetenv("OPENBLAS_CORETYPE");
  if (spin) ::unsetenv("GOMP_SPINCOUNT");
  ::unsetenv(kReexecMarker);
  std::fprintf(stderr, "longtrain: could not re-execute (%s); BLAS stays on %s\n", std::strerror(errno),
               core.c_str());
}

int threadsPerRank(int asked, int localRanks) {
  if (asked > 0) return asked;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, localRanks));
}

int64_t l2CacheBytes() {
  const long n = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (n > 0) return n;
  FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index2/size", "r");
  if (!f) return 0;
  long long v = 0;
  char unit = 0;
  const int got = std::fscanf(f, "%lld%c", &v, &unit);
  std::fclose(f);
  if (got < 1 || v <= 0) return 0;
  return unit == 'M' ? v << 20 : unit == 'K' ? v << 10 : v;
}

}  // namespace lt
