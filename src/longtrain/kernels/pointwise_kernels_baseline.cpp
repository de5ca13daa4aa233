// Fused RMSNorm and SwiGLU for x86-64's baseline (SSE2, 4 lanes); the code is pointwise_kernels.inc, the
// flags come from CMakeLists.txt, and fused_ops.cpp calls it only when the CPU has them.
#define LT_PW_ISA baseline
#define LT_SIMD_WIDTH 4
#include "longtrain/model/pointwise_kernels.inc"
