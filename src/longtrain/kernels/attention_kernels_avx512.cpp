// The fused attention kernel for AVX-512 F (16 lanes); the code is attention_kernels.inc, the flags
// come from CMakeLists.txt, and fused_attention.cpp calls it only when the CPU has them.
#define LT_ATTN_ISA avx512
#define LT_SIMD_WIDTH 16
#include "longtrain/model/attention_kernels.inc"
