// The fused attention kernel for x86-64's baseline (SSE2, 4 lanes); the code is attention_kernels.inc, the flags
// come from CMakeLists.txt, and fused_attention.cpp calls it only when the CPU has them.
#define LT_ATTN_ISA baseline
#define LT_SIMD_WIDTH 4
#include "longtrain/model/attention_kernels.inc"
