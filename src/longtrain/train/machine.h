// The machine's figures that speed is judged against: the measured fp32 GEMM peak, the
// model's FLOPs per token (for MFU), and a numerics check of the BLAS kernel in use.
// Non-obvious: the peak is measured in-process with the thread count the rank trains with
// (a few 1024^3 sgemms, ~0.1 s), not taken from a spec sheet: MFU is against what this BLAS
// reaches on these cores.
#pragma once
#include <cstdint>

#include "longtrain/config/config.h"
#include "longtrain/kernels/gemm.h"
#include "longtrain/model/model.h"

namespace lt::train {

// Model FLOPs per trained token (forward + backward, recompute not counted):
//   6 x (parameters - embedding table + LM head)   the matmuls (the embedding is a lookup)
// + 6 x layers x seq_len x heads x head_dim         causal attention: QK^T and PV, 2 FLOPs a
//                                                   multiply-add, x3 for backward, halved by the mask
//                                                   (a sliding window W < seq_len: 2W - W^2/seq_len
//                                                   for seq_len, the keys it leaves)
double modelFlopsPerToken(const model::ModelConfig& m, int64_t seqLen);

// Best-of-several GEMM rate (FLOP/s) at the current at::get_num_threads() by `route`: fp32
// through ATen (OpenBLAS) or oneDNN's sgemm, or bf16 operands with an fp32 result (oneDNN's
// matmul: AVX512_BF16 / AMX where the CPU has them; widened to fp32, slowly, where it has none).
double measureGemmPeakFlops(kernels::GemmRoute route = kernels::GemmRoute::Blas);

// Best-of-3 seconds of one fused attention forward + backward (B = 1, random inputs) with fp32
// or bf16 tile products (bf16.attention's start-up comparison).
double measureAttentionSeconds(int64_t heads, int64_t kvHeads, int64_t headDim, int64_t seq, int64_t tile, bool bf16);

// bf16 is chosen where it beats fp32 by this factor (bf16.enabled's GEMMs, bf16.attention's products).
constexpr double kBf16FasterBy = 1.1;

// bf16.attention's start-up comparison, at the model's head dim and group and min(seq_len, 1024)
// tokens: whether bf16 tile products beat fp32 by 10% on this CPU (false where it has no
// AVX512_BF16), with the two times in seconds (0 where not measured). `longtrain train` decides by
// it (on every rank) and `longtrain plan` predicts with it.
struct Bf16AttentionChoice {
  bool faster = false;
  int64_t tokens = 0;
  double fp32Seconds = 0, bf16Seconds = 0;
};
Bf16AttentionChoice measureBf16Attention(const model::ModelConfig& m, int64_t seqLen);

// bf16.attention's rule, the one `train` and `plan` share. Asked for: bf16 GEMMs in use, the
// config's bf16.attention and the fused kernel (the config's alone, so the same on every rank).
// Wins on this rank: a CPU with AVX512_BF16 and, unless bf16.only_if_faster is off,
// measureBf16Attention's verdict (written to `measured` when it ran). `train` then takes the
// world's agreement.
bool bf16AttentionAskedFor(const config::Config& cfg, bool bf16Gemms);
bool bf16AttentionWinsHere(const config::Config& cfg, Bf16AttentionChoice* measured = nullptr);

// Largest error of an fp32 GEMM route (at::mm, or oneDNN's sgemm) against a double-precision
// loop, over odd shapes that exercise the kernel's edge paths, relative to sum_k |a_ik| |b_kj|
// (the bound fp32 error scales with).
double gemmRelativeError(kernels::GemmRoute route = kernels::GemmRoute::Blas);

}  // namespace lt::train
