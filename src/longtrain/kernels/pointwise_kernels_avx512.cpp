// Fused RMSNorm and SwiGLU for AVX-512 F (16 lanes); the code is pointwise_kernels.inc, the
// flags come from CMakeLists.txt, and fused_ops.cpp calls it only when the CPU has them.
#define LT_PW_ISA avx512
#define LT_SIMD_WIDTH 16
#include "longtrain/model/pointwise_kernels.inc"
