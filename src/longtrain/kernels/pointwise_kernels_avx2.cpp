// Fused RMSNorm and SwiGLU for AVX2 + FMA (8 lanes); the code is pointwise_kernels.inc, the
// flags come from CMakeLists.txt, and fused_ops.cpp calls it only when the CPU has them.
#define LT_PW_ISA avx2
#define LT_SIMD_WIDTH 8
#include "longtrain/model/pointwise_kernels.inc"
