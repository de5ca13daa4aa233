// The CPU kernels (longtrain/kernels/) the model is built on, named in lt::model as its own ops,
// as model.h names config's sections (using config::ModelConfig). Non-obvious: only
// using-declarations live here; the kernels, their ISA dispatch and their equivalence tests are
// kernels/'s, and what is model logic around them (document masks, RoPE tables) is attention.h's.
#pragma once
#include "longtrain/kernels/fused_attention.h"
#include "longtrain/kernels/fused_ops.h"
#include "longtrain/kernels/gemm.h"
#include "longtrain/kernels/isa.h"

namespace lt::model {

using kernels::Isa;
using kernels::isaBest;
// attention
using kernels::fusedAttention;
using kernels::fusedAttentionBf16Supported;
using kernels::FusedAttentionOptions;
// pointwise
using kernels::fusedRmsNorm;
using kernels::fusedRope;
using kernels::fusedSwiglu;
using kernels::RopeTable;
using kernels::softmaxCrossEntropyGradInPlace;
using kernels::softmaxCrossEntropyInPlace;
using kernels::toBf16;
using kernels::toBf16InPlace;
// the GEMM routes
using kernels::GemmRoute;
using kernels::linear;
using kernels::matmul;
using kernels::matmulInto;
using kernels::matmulAccumulate;

}  // namespace lt::model
