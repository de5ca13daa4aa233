// The bytes the kernels of this module hold, declared beside their code (the .cpp that
// allocates) for `longtrain plan`. Non-obvious: kernels see no config, so they take the step's
// shapes alone; the caller says which of a kernel's tensors are its own (core/footprint.h).
#pragma once
#include "longtrain/core/footprint.h"

namespace lt::kernels {

// FusedAttentionFn (fused_attention.cpp) on a rank's [B, S, H/P, Dh] heads. `ownsInputs`: q, k,
// v and the output are held only by the kernel (after Ulysses' all-to-all); false where the
// caller already saves them (one rank: they are the rotations and o_proj's input).
Footprint fusedAttentionFootprint(const StepShape& s, bool ownsInputs);

// Bytes one bf16 GEMM (gemm.cpp's bf16gemm) allocates while it runs, c [M, N] = op(a) op(b) with
// op(a) [M, K]: oneDNN's scratchpad for the shape, or where this CPU has no oneDNN bf16 kernel
// (AVX2) both operands widened to fp32 for the BLAS. Asks oneDNN, as the GEMM does; `accumulate`:
// the primitive that adds into c (matmulAccumulate).
double bf16GemmWorkBytes(bool transA, bool transB, double M, double N, double K, bool accumulate = false);

}  // namespace lt::kernels
