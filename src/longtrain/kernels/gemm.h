// The model's fp32 GEMMs through oneDNN's sgemm, beside ATen's (OpenBLAS). Non-obvious:
// oneDNN picks its kernel from cpuid at run time (AVX-512 wherever the CPU has it), so it
// does not depend on OPENBLAS_CORETYPE, which some machines must pin to an older kernel
// (OpenBLAS 0.3.21 computes wrong results on CPUs it does not know). model.gemm "auto" takes it
// on every CPU with AVX2 and FMA (oneDnnIsTheFp32Default); libtorch links the same libdnnl.
#pragma once
#include <ATen/core/Tensor.h>

namespace lt::kernels {

// How a GEMM runs: ATen's fp32 (OpenBLAS), oneDNN's fp32 sgemm, or oneDNN's bf16 matmul: the
// operands rounded to bf16 (their saved copies too), the product accumulated and returned in fp32.
enum class GemmRoute { Blas, OneDnn, Bf16 };

// y = x w^T over x's last dimension (at::linear without a bias) by `route`, differentiable in x
// and w: the model's projections, MLP and LM head. x [..., K], w [N, K] fp32; y and both
// gradients fp32. On the BLAS route every product runs a few thousand rows of its result a call
// (gemm.cpp's kBlasRowBlock), so OpenBLAS's packing buffers stay small at any sequence length or
// vocabulary.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, GemmRoute route);

// out = op(a) op(b) by `route` for contiguous 2-D a, b and fp32 out (op: transposed when asked,
// read in place), without autograd: the fused LM head's three products and the peak measurement.
// On the Bf16 route a and b may already be bf16 (then nothing is converted).
// `matmul` allocates out.
void matmulInto(at::Tensor& out, const at::Tensor& a, bool transA, const at::Tensor& b, bool transB, GemmRoute route);
at::Tensor matmul(const at::Tensor& a, bool transA, const at::Tensor& b, bool transB, GemmRoute route);
// out += op(a) op(b) in the GEMM itself, so no product-sized temporary exists (the LM head's
// [V, D] weight gradient, per loss tile): beta = 1 on the fp32 routes (the BLAS's in row blocks),
// oneDNN's sum post-op on the bf16 route (its widened fallback: the BLAS's beta = 1).
void matmulAccumulate(at::Tensor& out, const at::Tensor& a, bool transA, const at::Tensor& b, bool transB, GemmRoute route);

// model.gemm "auto": whether oneDNN's sgemm runs the fp32 GEMMs on this CPU. A rule, not a race
// at start-up (a timing on a busy machine could choose differently between a run and its resume,
// and the routes' bits differ): every CPU with AVX2 and FMA, where its JIT kernels beat OpenBLAS
// 0.3.21 at every shape measured (docs/performance.md, "GEMM routes"); OpenBLAS below that.
bool oneDnnIsTheFp32Default();

// Tests: the bf16 route's products on operands widened to fp32 (what a CPU without a oneDNN bf16
// kernel runs), whatever this CPU has. Process-wide.
void forceWidenedBf16ForTesting(bool on);

}  // namespace lt::kernels
