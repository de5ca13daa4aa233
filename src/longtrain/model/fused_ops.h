// Fused RMSNorm and SwiGLU as autograd functions: one pass over the tensors forward and one
// backward each (the ATen compositions in model.cpp take 5 and 3 passes forward, twice that
// backward, and save 1-2 more activations). Non-obvious: SwiGLU takes the gate and up
// projections as one [.., 2F] tensor, the output of one GEMM against [wGate; wUp], and saves only
// that tensor; silu is recomputed in backward.
#pragma once
#include <ATen/core/Tensor.h>

#include "longtrain/model/kernel_isa.h"

namespace lt::model {

// x [.., D], w [D] -> x / sqrt(mean(x^2) + eps) * w; differentiable in x and w.
at::Tensor fusedRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, KernelIsa isa = kernelBestIsa());

// gu [.., 2F] (gate then up) -> silu(gate) * up [.., F]; differentiable in gu.
at::Tensor fusedSwiglu(const at::Tensor& gu, KernelIsa isa = kernelBestIsa());

}  // namespace lt::model
