// AVX-512 CPU Adam kernels (16 lanes, -mavx512f -mavx512bw -mfma), called only via cpu_adam.cpp's
// dispatch. Non-obvious: the tail uses masked loads (and stores, but for the bf16 copy's), so every
// element takes the same path (the main loops add prefetches, which change no value); helpers have internal
// linkage, so no AVX-512 copy of a shared inline function can leak.
// GCC 12's AVX-512 intrinsic headers trip a false -Wmaybe-uninitialized (their
// `__m512 __Y = __Y;` placeholders, GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// No FMA contraction of separate mul and add: see cpu_adam_avx2.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "longtrain/kernels/cpu_adam.h"

#define LT_SIMD_WIDTH 16

namespace lt::kernels::detail {

namespace {

#include "longtrain/kernels/simd.inc"

constexpr int kLanes = W;

struct Coeffs16 {
  __m512 decay, l2, beta1, oneMinusBeta1, beta2, oneMinusBeta2, sqrtBias2, eps, negStepSize;
  explicit Coeffs16(const AdamCoeffs& c)
      : decay(_mm512_set1_ps(c.decay)), l2(_mm512_set1_ps(c.l2)), beta1(_mm512_set1_ps(c.beta1)),
        oneMinusBeta1(_mm512_set1_ps(c.oneMinusBeta1)), beta2(_mm512_set1_ps(c.beta2)),
        oneMinusBeta2(_mm512_set1_ps(c.oneMinusBeta2)), sqrtBias2(_mm512_set1_ps(c.sqrtBias2)),
        eps(_mm512_set1_ps(c.eps)), negStepSize(_mm512_set1_ps(c.negStepSize)) {}
};

// The same ops and roundings as the AVX2 kernel (libtorch 1.13's vector lambdas).
template <bool kL2>
__attribute__((always_inline)) inline __m512 update(__m512 p, __m512 g, __m512& m, __m512& v,
                                                    const Coeffs16& c) {
  if constexpr (kL2) g = _mm512_fmadd_ps(p, c.l2, g);                  // grad.add(p, wd)
  p = _mm512_mul_ps(p, c.decay);                                       // p.mul_(1 - lr*wd)
  m = _mm512_fmadd_ps(g, c.oneMinusBeta1, _mm512_mul_ps(m, c.beta1));  // m.mul_(b1).add_(g, 1-b1)
  v = _mm512_fmadd_ps(_mm512_mul_ps(g, c.oneMinusBeta2), g,            // v.mul_(b2)
                      _mm512_mul_ps(v, c.beta2));                      //  .addcmul_(g, g, 1-b2)
  const __m512 denom =  // sqrt(v) / sqrt(bias2) + eps
      _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), c.sqrtBias2), c.eps);
  return _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(c.negStepSize, m), denom));  // addcdiv_
}

__attribute__((always_inline)) inline __m512 bf16Load(const uint16_t* src, __mmask16 k) {
  // 16 bf16 values are 256 bits; the BW masked load of 32 halves keeps only the low 16.
  const __m512i wide = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(k), src);
  const __m256i h = _mm512_castsi512_si256(wide);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Round to nearest even, NaN to 0x7FC0: bit for bit what c10::BFloat16 does. The 16 results,
// each <= 0xFFFF, narrowed in a register (truncation is exact): the masked store form of
// vpmovdw is 2.4x slower per step here (AMD Zen 5).
__attribute__((always_inline)) inline __m256i bf16Round(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb);
  r = _mm512_srli_epi32(r, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7FC0)));
}

// One 16-lane block at i, lanes outside k neither read nor written.
template <bool kL2>
__attribute__((always_inline)) inline void fp32Block(const float* pIn, const float* mIn, const float* vIn,
                                                     const float* g, float* p, float* m, float* v,
                                                     int64_t i, __mmask16 k, const Coeffs16& c) {
  __m512 mm = _mm512_maskz_loadu_ps(k, mIn + i), vv = _mm512_maskz_loadu_ps(k, vIn + i);
  const __m512 pp =
      update<kL2>(_mm512_maskz_loadu_ps(k, pIn + i), _mm512_maskz_loadu_ps(k, g + i), mm, vv, c);
  _mm512_mask_storeu_ps(p + i, k, pp);
  _mm512_mask_storeu_ps(m + i, k, mm);
  _mm512_mask_storeu_ps(v + i, k, vv);
}

template <bool kL2>
void fp32Kernel(const float* pIn, const float* mIn, const float* vIn, const float* g, float* p, float* m,
                float* v, int64_t n, const AdamCoeffs& coeffs) {
  const Coeffs16 c(coeffs);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {  // one block is one cache line per stream
    prefetchStreams(pIn, mIn, vIn, g, i + kPrefetchAhead);
    fp32Block<kL2>(pIn, mIn, vIn, g, p, m, v, i, __mmask16(0xFFFF), c);
  }
  if (i < n) fp32Block<kL2>(pIn, mIn, vIn, g, p, m, v, i, __mmask16((1u << (n - i)) - 1), c);
}

// One 16-lane block at i, lanes outside k neither read nor written.
template <bool kL2>
__attribute__((always_inline)) inline void bf16Block(uint16_t* pBf16, float* pMaster, const float* g, float* m,
                                                     float* v, int64_t i, __mmask16 k, const Coeffs16& c) {
  const __m512 p0 = pMaster ? _mm512_maskz_loadu_ps(k, pMaster + i) : bf16Load(pBf16 + i, k);
  __m512 mm = _mm512_maskz_loadu_ps(k, m + i), vv = _mm512_maskz_loadu_ps(k, v + i);
  const __m512 pp = update<kL2>(p0, _mm512_maskz_loadu_ps(k, g + i), mm, vv, c);
  if (pMaster) _mm512_mask_storeu_ps(pMaster + i, k, pp);
  const __m256i b = bf16Round(pp);
  if (k == __mmask16(0xFFFF)) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pBf16 + i), b);
  } else {  // a 256-bit masked store needs -mavx512vl, which this file is not compiled with
    alignas(32) uint16_t tail[kLanes];
    _mm256_store_si256(reinterpret_cast<__m256i*>(tail), b);
    for (int j = 0; j < kLanes; ++j)
      if (k >> j & 1) pBf16[i + j] = tail[j];
  }
  _mm512_mask_storeu_ps(m + i, k, mm);
  _mm512_mask_storeu_ps(v + i, k, vv);
}

template <bool kL2>
void bf16Kernel(uint16_t* pBf16, float* pMaster, const float* g, float* m, float* v, int64_t n,
                const AdamCoeffs& coeffs) {
  const Coeffs16 c(coeffs);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if (pMaster) prefetchStreams(pMaster, m, v, g, i + kPrefetchAhead);
    bf16Block<kL2>(pBf16, pMaster, g, m, v, i, __mmask16(0xFFFF), c);
  }
  if (i < n) bf16Block<kL2>(pBf16, pMaster, g, m, v, i, __mmask16((1u << (n - i)) - 1), c);
}

}  // namespace

void adamKernelAvx512(const float* pIn, const float* mIn, const float* vIn, const float* g, float* p, float* m,
                      float* v, int64_t n, const AdamCoeffs& c) {
  if (c.l2 != 0) fp32Kernel<true>(pIn, mIn, vIn, g, p, m, v, n, c);
  else fp32Kernel<false>(pIn, mIn, vIn, g, p, m, v, n, c);
}

void adamKernelBf16Avx512(uint16_t* pBf16, float* pMaster, const float* g, float* m, float* v,
                          int64_t n, const AdamCoeffs& c) {
  if (c.l2 != 0) bf16Kernel<true>(pBf16, pMaster, g, m, v, n, c);
  else bf16Kernel<false>(pBf16, pMaster, g, m, v, n, c);
}

}  // namespace lt::kernels::detail
