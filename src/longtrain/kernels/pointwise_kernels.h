// The fused RMSNorm, SwiGLU and RoPE kernels' (and the bf16 GEMM route's conversion) raw
// interface over plain float rows, compiled once per ISA (pointwise_kernels.inc) and reached only
// through fused_ops.cpp's dispatch. Each function makes one pass over its rows; no libtorch here.
#pragma once
#include <cstdint>

namespace lt::kernels::pointwise_detail {

struct Kernels {
  // y = x * rstd * w, rstd[r] = 1 / sqrt(mean(x[r]^2) + eps); rows of D floats.
  void (*rmsNormForward)(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t D, float eps);
  // dx = rstd * (g - x * rstd^2 * mean(g * x)) with g = dy * w; dwAcc[d] += sum_r dy * x * rstd.
  void (*rmsNormBackward)(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                          float* dwAcc, int64_t rows, int64_t D);
  // h = silu(gate) * up, where row r of gu holds gate (F floats) then up (F floats); with
  // gu16, also gu's bf16 bits (as toBf16), in the same pass.
  void (*swigluForward)(const float* gu, float* h, uint16_t* gu16, int64_t rows, int64_t F);
  // dgu = [dh * up * silu'(gate), dh * silu(gate)], rows as gu; the second form reads gu as bf16.
  void (*swigluBackward)(const float* gu, const float* dh, float* dgu, int64_t rows, int64_t F);
  void (*swigluBackwardBf16)(const uint16_t* gu16, const float* dh, float* dgu, int64_t rows, int64_t F);
  // Rotary embedding, half-split layout, for `tokens` tokens of H heads of Dh = 2 x half:
  // out = [x1 c - x2 s, x2 c + x1 s] with c, s the token's [half] row of cos, sin. x's tokens
  // are xStride floats apart (heads contiguous within); out is contiguous [tokens, H, Dh].
  // The backward is the same rotation by -angle (sign = -1).
  void (*rope)(const float* x, int64_t xStride, const float* cos, const float* sin, float* out, int64_t tokens,
               int64_t H, int64_t half, float sign);
  // y = bf16 bits of x, rounded to nearest even, NaN -> 0x7FC0: c10::BFloat16's rounding exactly.
  void (*toBf16)(const float* x, uint16_t* y, int64_t n);
  // y = exp(x) and y = 2^x by simd.inc's vexp and vexp2: the sigmoid's and the attention
  // softmax's exps (the attention builds compile the same code with the same flags), reachable
  // here so their accuracy is tested per build (kernels_test).
  void (*exp)(const float* x, float* y, int64_t n);
  void (*exp2)(const float* x, float* y, int64_t n);
  // Softmax cross-entropy over rows of `cols` logits, in place: row r's maximum m (argmax[r] its
  // first index), x = exp(x - m) written back, s their sum; loss[r] = log s + m - (target's
  // logit), invSum[r] = 1 / s. The gradient then turns those rows into (x / s - onehot) scale[r].
  void (*softmaxCrossEntropy)(float* x, const int64_t* target, float* loss, int64_t* argmax, float* invSum,
                              int64_t rows, int64_t cols);
  void (*softmaxCrossEntropyGrad)(float* x, const int64_t* target, const float* invSum, const float* scale,
                                  int64_t rows, int64_t cols);
};

#define LT_POINTWISE_DECLARE(isa) Kernels kernels_##isa();
LT_POINTWISE_DECLARE(baseline)
LT_POINTWISE_DECLARE(avx2)
LT_POINTWISE_DECLARE(avx512)
#undef LT_POINTWISE_DECLARE

}  // namespace lt::kernels::pointwise_detail
