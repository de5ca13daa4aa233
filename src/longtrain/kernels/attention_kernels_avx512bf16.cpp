// The fused attention kernel for AVX-512 F with AVX512_BF16: the AVX-512 build, with every tile
// product on bf16 operands (attention_bf16.inc); fused_attention.cpp calls it only when asked for
// bf16 and the CPU has the instructions.
#define LT_ATTN_ISA avx512bf16
#define LT_SIMD_WIDTH 16
#define LT_ATTN_BF16 1
#include "longtrain/kernels/attention_kernels.inc"
