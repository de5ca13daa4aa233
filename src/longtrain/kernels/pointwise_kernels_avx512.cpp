// Fused RMSNorm, SwiGLU and RoPE for AVX-512 F (16 lanes). The code is pointwise_kernels.inc; the
// flags come from CMakeLists.txt's longtrain_isa_sources by this file's _<isa> suffix, and
// fused_ops.cpp calls it only when the CPU has them.
#define LT_PW_ISA avx512
#define LT_SIMD_WIDTH 16
#include "longtrain/kernels/pointwise_kernels.inc"
