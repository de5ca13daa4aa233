// The fused attention kernel for AVX-512 F (16 lanes). The code is attention_kernels.inc; the flags
// come from CMakeLists.txt's longtrain_isa_sources by this file's _<isa> suffix, and
// fused_attention.cpp calls it only when the CPU has them.
#define LT_ATTN_ISA avx512
#define LT_SIMD_WIDTH 16
#include "longtrain/kernels/attention_kernels.inc"
