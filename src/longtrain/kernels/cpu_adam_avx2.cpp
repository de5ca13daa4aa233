// AVX2+FMA CPU Adam kernels (8 lanes, -mavx2 -mfma), called only via cpu_adam.cpp's dispatch.
// Non-obvious: the tail runs through a zero-padded 8-lane block, so every element takes the same
// path (the fp32 main loop only adds prefetches, which change no value); helpers have internal
// linkage, so no AVX2 copy of a shared inline function can leak.
// GNU mode (-std=gnu++20) lets GCC fuse a separate mul and add into an FMA (-ffp-contract=fast),
// which libtorch's separately rounded ops do not: after 10 steps that alone moved p by up to
// 2.4e-6 from torch::optim::AdamW. Contraction is off; the FMAs libtorch has are written out.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "longtrain/kernels/cpu_adam.h"

#define LT_SIMD_WIDTH 8

namespace lt::kernels::detail {

namespace {

#include "longtrain/kernels/simd.inc"

constexpr int kLanes = W;

struct Coeffs8 {
  __m256 decay, l2, beta1, oneMinusBeta1, beta2, oneMinusBeta2, sqrtBias2, eps, negStepSize;
  explicit Coeffs8(const AdamCoeffs& c)
      : decay(_mm256_set1_ps(c.decay)), l2(_mm256_set1_ps(c.l2)), beta1(_mm256_set1_ps(c.beta1)),
        oneMinusBeta1(_mm256_set1_ps(c.oneMinusBeta1)), beta2(_mm256_set1_ps(c.beta2)),
        oneMinusBeta2(_mm256_set1_ps(c.oneMinusBeta2)), sqrtBias2(_mm256_set1_ps(c.sqrtBias2)),
        eps(_mm256_set1_ps(c.eps)), negStepSize(_mm256_set1_ps(c.negStepSize)) {}
};

// libtorch 1.13's vector lambdas, op by op and rounding by rounding: add_ with alpha is
// vec::fmadd(other, alpha, self), and addcmul's `self + value * t1 * t2` is built contracted to
// one fma. Exact sqrt and division, no rsqrt. On an AVX2 CPU this gives p, m and v bit-identical
// to Debian's torch::optim::AdamW and Adam over 10 steps of 1M elements (measured).
template <bool kL2>
__attribute__((always_inline)) inline __m256 update(__m256 p, __m256 g, __m256& m, __m256& v,
                                                    const Coeffs8& c) {
  if constexpr (kL2) g = _mm256_fmadd_ps(p, c.l2, g);                  // grad.add(p, wd)
  p = _mm256_mul_ps(p, c.decay);                                       // p.mul_(1 - lr*wd)
  m = _mm256_fmadd_ps(g, c.oneMinusBeta1, _mm256_mul_ps(m, c.beta1));  // m.mul_(b1).add_(g, 1-b1)
  v = _mm256_fmadd_ps(_mm256_mul_ps(g, c.oneMinusBeta2), g,            // v.mul_(b2)
                      _mm256_mul_ps(v, c.beta2));                      //  .addcmul_(g, g, 1-b2)
  const __m256 denom =  // sqrt(v) / sqrt(bias2) + eps
      _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), c.sqrtBias2), c.eps);
  return _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(c.negStepSize, m), denom));  // addcdiv_
}

__attribute__((always_inline)) inline __m256 bf16Load(const uint16_t* src) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Round to nearest even, NaN to 0x7FC0: bit for bit what c10::BFloat16 does.
__attribute__((always_inline)) inline void bf16Store(uint16_t* dst, __m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
  r = _mm256_srli_epi32(r, 16);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
  // Every lane is <= 0xFFFF, so the saturating pack is exact.
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), packed);
}

template <bool kL2>
__attribute__((always_inline)) inline void fp32Block(const float* pIn, const float* mIn, const float* vIn,
                                                     const float* g, float* p, float* m, float* v,
                                                     int64_t i, const Coeffs8& c) {
  __m256 mm = _mm256_loadu_ps(mIn + i), vv = _mm256_loadu_ps(vIn + i);
  const __m256 pp = update<kL2>(_mm256_loadu_ps(pIn + i), _mm256_loadu_ps(g + i), mm, vv, c);
  _mm256_storeu_ps(p + i, pp);
  _mm256_storeu_ps(m + i, mm);
  _mm256_storeu_ps(v + i, vv);
}

template <bool kL2>
void fp32Kernel(const float* pIn, const float* mIn, const float* vIn, const float* g, float* p, float* m,
                float* v, int64_t n, const AdamCoeffs& coeffs) {
  const Coeffs8 c(coeffs);
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {  // two blocks are one cache line per stream
    prefetchStreams(pIn, mIn, vIn, g, i + kPrefetchAhead);
    fp32Block<kL2>(pIn, mIn, vIn, g, p, m, v, i, c);
    fp32Block<kL2>(pIn, mIn, vIn, g, p, m, v, i + kLanes, c);
  }
  for (; i + kLanes <= n; i += kLanes) fp32Block<kL2>(pIn, mIn, vIn, g, p, m, v, i, c);
  if (i == n) return;
  alignas(32) float tp[kLanes] = {}, tg[kLanes] = {}, tm[kLanes] = {}, tv[kLanes] = {};
  const int64_t r = n - i;
  for (int64_t j = 0; j < r; ++j) {
    tp[j] = pIn[i + j], tg[j] = g[i + j], tm[j] = mIn[i + j], tv[j] = vIn[i + j];
  }
  fp32Block<kL2>(tp, tm, tv, tg, tp, tm, tv, 0, c);
  for (int64_t j = 0; j < r; ++j) p[i + j] = tp[j], m[i + j] = tm[j], v[i + j] = tv[j];
}

template <bool kL2>
void bf16Kernel(uint16_t* pBf16, float* pMaster, const float* g, float* m, float* v, int64_t n,
                const AdamCoeffs& coeffs) {
  const Coeffs8 c(coeffs);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 p0 = pMaster ? _mm256_loadu_ps(pMaster + i) : bf16Load(pBf16 + i);
    __m256 mm = _mm256_loadu_ps(m + i), vv = _mm256_loadu_ps(v + i);
    const __m256 pp = update<kL2>(p0, _mm256_loadu_ps(g + i), mm, vv, c);
    if (pMaster) _mm256_storeu_ps(pMaster + i, pp);
    bf16Store(pBf16 + i, pp);
    _mm256_storeu_ps(m + i, mm);
    _mm256_storeu_ps(v + i, vv);
  }
  if (i == n) return;
  alignas(32) float tp[kLanes] = {}, tg[kLanes] = {}, tm[kLanes] = {}, tv[kLanes] = {};
  alignas(16) uint16_t tb[kLanes] = {};
  const int64_t r = n - i;
  for (int64_t j = 0; j < r; ++j) {
    if (pMaster) tp[j] = pMaster[i + j];
    else tb[j] = pBf16[i + j];
    tg[j] = g[i + j], tm[j] = m[i + j], tv[j] = v[i + j];
  }
  const __m256 p0 = pMaster ? _mm256_load_ps(tp) : bf16Load(tb);
  __m256 mm = _mm256_load_ps(tm), vv = _mm256_load_ps(tv);
  const __m256 pp = update<kL2>(p0, _mm256_load_ps(tg), mm, vv, c);
  _mm256_store_ps(tp, pp);
  bf16Store(tb, pp);
  _mm256_store_ps(tm, mm);
  _mm256_store_ps(tv, vv);
  for (int64_t j = 0; j < r; ++j) {
    if (pMaster) pMaster[i + j] = tp[j];
    pBf16[i + j] = tb[j], m[i + j] = tm[j], v[i + j] = tv[j];
  }
}

}  // namespace

void adamKernelAvx2(const float* pIn, const float* mIn, const float* vIn, const float* g, float* p, float* m,
                    float* v, int64_t n, const AdamCoeffs& c) {
  if (c.l2 != 0) fp32Kernel<true>(pIn, mIn, vIn, g, p, m, v, n, c);
  else fp32Kernel<false>(pIn, mIn, vIn, g, p, m, v, n, c);
}

void adamKernelBf16Avx2(uint16_t* pBf16, float* pMaster, const float* g, float* m, float* v,
                        int64_t n, const AdamCoeffs& c) {
  if (c.l2 != 0) bf16Kernel<true>(pBf16, pMaster, g, m, v, n, c);
  else bf16Kernel<false>(pBf16, pMaster, g, m, v, n, c);
}

}  // namespace lt::kernels::detail
