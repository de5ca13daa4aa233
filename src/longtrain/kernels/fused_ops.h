// Fused RMSNorm, SwiGLU and RoPE as autograd functions: one pass over the tensors forward and one
// backward each (the ATen compositions in model.cpp take 5 and 3 passes forward, twice that
// backward, and save 1-2 more activations). Non-obvious: SwiGLU takes the gate and up
// projections as one [.., 2F] tensor, the output of one GEMM against [wGate; wUp], and saves only
// that tensor; silu is recomputed in backward.
#pragma once
#include <ATen/core/Tensor.h>

#include "longtrain/kernels/isa.h"

namespace lt::kernels {

// x [.., D], w [D] -> x / sqrt(mean(x^2) + eps) * w; differentiable in x and w.
at::Tensor fusedRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, Isa isa = isaBest());

// gu [.., 2F] (gate then up) -> silu(gate) * up [.., F]; differentiable in gu. saveBf16 keeps
// gu for backward as bf16 (the bf16 GEMM route): the forward is unchanged, the gradient is the
// exact one at gu rounded to bf16.
at::Tensor fusedSwiglu(const at::Tensor& gu, Isa isa = isaBest(), bool saveBf16 = false);

// RoPE's per-token angles, computed once per step and shared by every block's q and k: cos and
// sin [B, S, Dh/2] (model::ropeTable makes them, with the model's frequencies and scaling).
struct RopeTable {
  at::Tensor cos, sin;
};

// x [B, S, H, Dh] (heads and dims contiguous, tokens at any stride: a column slice of the one
// q/k/v GEMM's output) -> the rotated [B, S, H, Dh], contiguous; differentiable in x.
at::Tensor fusedRope(const at::Tensor& x, const RopeTable& table, Isa isa = isaBest());

// x fp32, any shape -> a contiguous bf16 copy, rounded as c10::BFloat16 rounds (to nearest
// even): the bf16 GEMM route's operands. One parallel pass; no autograd.
at::Tensor toBf16(const at::Tensor& x, Isa isa = isaBest());

// The same rounding written over x's own first half (x contiguous fp32; its values are gone),
// returned as a bf16 tensor of x's shape sharing x's storage: for a buffer too large to copy
// (the fused LM head's logits gradient). Parallel in waves that never write what is unread.
at::Tensor toBf16InPlace(const at::Tensor& x, Isa isa = isaBest());

// exp(x) and 2^x elementwise by the kernels' own polynomials (the sigmoid's and the attention
// softmax's), contiguous fp32 in and out: for their accuracy tests. exp clamps x to [-87, 88],
// exp2 to [-125, 127].
at::Tensor kernelExp(const at::Tensor& x, Isa isa = isaBest());
at::Tensor kernelExp2(const at::Tensor& x, Isa isa = isaBest());

// The LM head's softmax cross-entropy over logits [T, V] (contiguous fp32), in place: returns each
// row's loss (log-sum-exp minus the target's logit), argmax (its first maximum) and 1 / sum(exp),
// and leaves exp(x - max) in x; target [T] int64 in [0, V). Then the gradient in place:
// x = (softmax - onehot(target)) * scale[row]. One pass of reads and one of writes each (a row of
// V floats stays in cache between its passes), rows spread over the threads. No autograd.
struct SoftmaxCrossEntropyRows {
  at::Tensor loss, argmax, invSum;  // [T]: fp32, int64, fp32
};
SoftmaxCrossEntropyRows softmaxCrossEntropyInPlace(at::Tensor& logits, const at::Tensor& target, Isa isa = isaBest());
void softmaxCrossEntropyGradInPlace(at::Tensor& probs, const at::Tensor& target, const at::Tensor& invSum,
                                    const at::Tensor& scale, Isa isa = isaBest());

// sum(x^2) in float64 for a contiguous fp32 x, in one pass that allocates nothing (a float's
// square is exact in a double). Fixed blocks are summed in order: the same bits at any thread count.
double sumOfSquares(const at::Tensor& x);

}  // namespace lt::kernels
