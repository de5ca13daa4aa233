// The fused attention kernel for AVX2 + FMA (8 lanes); the code is attention_kernels.inc, the flags
// come from CMakeLists.txt, and fused_attention.cpp calls it only when the CPU has them.
#define LT_ATTN_ISA avx2
#define LT_SIMD_WIDTH 8
#include "longtrain/model/attention_kernels.inc"
