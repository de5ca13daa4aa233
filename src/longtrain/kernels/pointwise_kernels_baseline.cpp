// Fused RMSNorm, SwiGLU and RoPE for x86-64's baseline (SSE2, 4 lanes). The code is
// pointwise_kernels.inc; the flags come from CMakeLists.txt's longtrain_isa_sources by this file's
// _<isa> suffix, and fused_ops.cpp calls it only when the CPU has them.
#define LT_PW_ISA baseline
#define LT_SIMD_WIDTH 4
#include "longtrain/kernels/pointwise_kernels.inc"
