// Software prefetch for the SIMD CPU Adam kernels (cpu_adam_avx2.cpp, cpu_adam_avx512.cpp), which
// include it alone. Non-obvious: everything is in an anonymous namespace, so each kernel file
// compiles its own copy with its own -m flags and none can stand in for the other at link time.
#pragma once
#include <xmmintrin.h>

#include <cstdint>

namespace lt::offload::detail {
namespace {

// 2 KiB ahead in each of the four streams. Without it the AVX-512 kernel reached ~91% of the
// in-place read-modify-write bound on 4 KiB pages and the AVX2 one 92% (the hardware streamer
// stops at every page boundary, and the sqrt/div chains leave fewer loads in flight than the
// plain RMW loop has); with it, 100-101%. Measured on a 2-vCPU AVX-512 Xeon VM, 1 and 2 threads;
// 0.5, 1 and 4 KiB did no better, and on 2 MiB pages it neither helps much nor hurts.
constexpr int64_t kPrefetchAhead = 2048 / sizeof(float);

// A prefetch never faults, so it may run past the end of the buffers.
__attribute__((always_inline)) inline void prefetchStreams(const float* a, const float* b, const float* c,
                                                           const float* d, int64_t i) {
  _mm_prefetch(reinterpret_cast<const char*>(a + i), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(b + i), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(c + i), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(d + i), _MM_HINT_T0);
}

}  // namespace
}  // namespace lt::offload::detail
