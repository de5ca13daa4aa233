// CPU Adam: checks, per-step scalars, run-time ISA dispatch, the thread split, the scalar
// reference kernel and CpuAdam's per-sub-group state. Non-obvious: this file has baseline flags
// and no intrinsics; the SIMD kernels have their own -m flags and are reached only from here.
#include "longtrain/kernels/cpu_adam.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <thread>

#include "longtrain/core/check.h"

namespace lt::kernels {

namespace {

// Chunks are aligned to 64 elements (a multiple of every vector width and of a cache line);
// below kMinChunk elements per thread, starting a thread costs more than it saves.
constexpr int64_t kChunkAlign = 64;
constexpr int64_t kMinChunk = 1 << 16;

using detail::AdamCoeffs;

AdamCoeffs makeCoeffs(const AdamParams& a, int64_t step) {
  // libtorch keeps options in double and computes these in double, casting at the kernel.
  const double lr = a.lr, wd = a.weightDecay, b1 = a.beta1, b2 = a.beta2;
  double bias1 = 1, bias2 = 1;
  if (a.biasCorrection) {
    bias1 = 1 - std::pow(b1, static_cast<double>(step));
    bias2 = 1 - std::pow(b2, static_cast<double>(step));
  }
  AdamCoeffs c;
  c.decay = a.adamw ? static_cast<float>(1 - lr * wd) : 1.0f;
  c.l2 = a.adamw ? 0.0f : static_cast<float>(wd);
  c.beta1 = static_cast<float>(b1);
  c.oneMinusBeta1 = static_cast<float>(1 - b1);
  c.beta2 = static_cast<float>(b2);
  c.oneMinusBeta2 = static_cast<float>(1 - b2);
  c.sqrtBias2 = static_cast<float>(std::sqrt(bias2));
  c.eps = static_cast<float>(a.eps);
  c.negStepSize = static_cast<float>(-(lr / bias1));
  return c;
}

void checkArgs(const void* p, const float* g, const float* m, const float* v, int64_t n,
               int64_t step, const AdamParams& a) {
  LT_CHECK(n >= 0, "CPU Adam: n = ", n, "; expected a non-negative element count");
  LT_CHECK(n == 0 || (p && g && m && v),
           "CPU Adam: a null buffer (p, g, m, v = ", p, ", ", g, ", ", m, ", ", v,
           ") for n = ", n, "; pass valid buffers of n elements");
  LT_CHECK(step >= 1, "CPU Adam: step = ", step, "; steps are 1-based (the step being taken)");
  LT_CHECK(a.lr >= 0 && std::isfinite(a.lr), "CPU Adam: lr = ", a.lr,
           "; expected a finite value >= 0");
  LT_CHECK(a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1,
           "CPU Adam: betas = (", a.beta1, ", ", a.beta2, "); each must be in [0, 1)");
  LT_CHECK(a.eps > 0 && std::isfinite(a.eps), "CPU Adam: eps = ", a.eps,
           "; expected a finite value > 0 (it keeps the denominator non-zero)");
  LT_CHECK(a.weightDecay >= 0 && std::isfinite(a.weightDecay), "CPU Adam: weight_decay = ",
           a.weightDecay, "; expected a finite value >= 0");
}

// Runs fn(begin, end) over contiguous chunks of [0, n); the caller takes the first chunk.
template <class Fn>
void parallelChunks(int64_t n, int threads, const Fn& fn) {
  const int64_t byGrain = (n + kMinChunk - 1) / kMinChunk;
  const int64_t t = std::min<int64_t>(std::max(threads, 1), std::max<int64_t>(byGrain, 1));
  if (t <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  int64_t chunk = (n + t - 1) / t;
  chunk = (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  std::vector<std::jthread> workers;  // joined on destruction, also if a start throws
  workers.reserve(t - 1);
  for (int64_t b = chunk; b < n; b += chunk) {
    workers.emplace_back([&fn, b, e = std::min(n, b + chunk)] { fn(b, e); });
  }
  fn(int64_t{0}, std::min(n, chunk));
}

float bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t floatToBf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

// The plain reference: each line is the scalar lambda of the libtorch op it names, in
// libtorch's order (the SIMD kernels mirror libtorch's vector lambdas instead, which fuse two
// of these lines into fmas; see cpu_adam_avx2.cpp). Contraction stays off even under
// LONGTRAIN_NATIVE, so the reference rounds the same way on every build.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
template <bool kL2>
inline float scalarUpdate(float p, float g, float& m, float& v, const AdamCoeffs& c) {
  if constexpr (kL2) g = g + c.l2 * p;                         // grad.add(p, wd)
  p = p * c.decay;                                             // p.mul_(1 - lr*wd)
  m = m * c.beta1 + c.oneMinusBeta1 * g;                       // m.mul_(b1).add_(g, 1-b1)
  v = v * c.beta2 + c.oneMinusBeta2 * g * g;                   // v.mul_(b2).addcmul_(g, g, 1-b2)
  const float denom = std::sqrt(v) / c.sqrtBias2 + c.eps;      // v.sqrt() / sqrt(bias2) + eps
  return p + c.negStepSize * m / denom;                        // p.addcdiv_(m, denom, -lr/bias1)
}

template <bool kL2>
void scalarKernel(const float* pIn, const float* mIn, const float* vIn, const float* g, float* p, float* m,
                  float* v, int64_t n, const AdamCoeffs& c) {
  for (int64_t i = 0; i < n; ++i) {
    float mm = mIn[i], vv = vIn[i];
    p[i] = scalarUpdate<kL2>(pIn[i], g[i], mm, vv, c);
    m[i] = mm;
    v[i] = vv;
  }
}

template <bool kL2>
void scalarKernelBf16(uint16_t* pBf16, float* pMaster, const float* g, float* m, float* v,
                      int64_t n, const AdamCoeffs& c) {
  for (int64_t i = 0; i < n; ++i) {
    const float p0 = pMaster ? pMaster[i] : bf16ToFloat(pBf16[i]);
    const float p = scalarUpdate<kL2>(p0, g[i], m[i], v[i], c);
    if (pMaster) pMaster[i] = p;
    pBf16[i] = floatToBf16(p);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// The builds: the scalar reference is the baseline one; Avx512Bf16 runs the Avx512 kernel (AVX-512
// F and BW: its bf16 store packs words).
Isa kernelFor(Isa isa) {
  LT_CHECK(isaSupported(isa), "CPU Adam: the ", isaName(isa),
           " kernel was requested but this CPU lacks its instructions; use isaBest()");
  constexpr Isa kBuilds[] = {Isa::Baseline, Isa::Avx2, Isa::Avx512};
  return isaAtMost(isa, std::begin(kBuilds), std::end(kBuilds));
}

void runKernel(Isa build, const float* pIn, const float* mIn, const float* vIn, const float* g, float* p,
               float* m, float* v, int64_t n, const AdamCoeffs& c) {
  switch (build) {
    case Isa::Avx512Bf16:
    case Isa::Avx512: return detail::adamKernelAvx512(pIn, mIn, vIn, g, p, m, v, n, c);
    case Isa::Avx2: return detail::adamKernelAvx2(pIn, mIn, vIn, g, p, m, v, n, c);
    case Isa::Baseline:
      return c.l2 != 0 ? scalarKernel<true>(pIn, mIn, vIn, g, p, m, v, n, c)
                       : scalarKernel<false>(pIn, mIn, vIn, g, p, m, v, n, c);
  }
}

void runKernelBf16(Isa build, uint16_t* pBf16, float* pMaster, const float* g, float* m,
                   float* v, int64_t n, const AdamCoeffs& c) {
  switch (build) {
    case Isa::Avx512Bf16:
    case Isa::Avx512: return detail::adamKernelBf16Avx512(pBf16, pMaster, g, m, v, n, c);
    case Isa::Avx2: return detail::adamKernelBf16Avx2(pBf16, pMaster, g, m, v, n, c);
    case Isa::Baseline:
      return c.l2 != 0 ? scalarKernelBf16<true>(pBf16, pMaster, g, m, v, n, c)
                       : scalarKernelBf16<false>(pBf16, pMaster, g, m, v, n, c);
  }
}

}  // namespace

void adamStepWith(Isa isa, float* p, const float* g, float* m, float* v, int64_t n,
                  int64_t step, const AdamParams& params, int threads) {
  const Isa build = kernelFor(isa);
  checkArgs(p, g, m, v, n, step, params);
  const AdamCoeffs c = makeCoeffs(params, step);
  parallelChunks(n, threads, [&](int64_t b, int64_t e) {
    runKernel(build, p + b, m + b, v + b, g + b, p + b, m + b, v + b, e - b, c);
  });
}

void adamStepInto(const float* pIn, const float* mIn, const float* vIn, const float* g, float* pOut,
                  float* mOut, float* vOut, int64_t n, int64_t step, const AdamParams& params, int threads) {
  const Isa build = kernelFor(isaBest());
  checkArgs(pIn, g, mIn, vIn, n, step, params);
  checkArgs(pOut, g, mOut, vOut, n, step, params);
  const AdamCoeffs c = makeCoeffs(params, step);
  parallelChunks(n, threads, [&](int64_t b, int64_t e) {
    runKernel(build, pIn + b, mIn + b, vIn + b, g + b, pOut + b, mOut + b, vOut + b, e - b, c);
  });
}

void adamStep(float* p, const float* g, float* m, float* v, int64_t n, int64_t step,
              const AdamParams& params, int threads) {
  adamStepWith(isaBest(), p, g, m, v, n, step, params, threads);
}

void adamStepBf16With(Isa isa, uint16_t* pBf16, float* pMaster, const float* g, float* m,
                      float* v, int64_t n, int64_t step, const AdamParams& params,
                      int threads) {
  const Isa build = kernelFor(isa);
  checkArgs(pBf16, g, m, v, n, step, params);
  const AdamCoeffs c = makeCoeffs(params, step);
  parallelChunks(n, threads, [&](int64_t b, int64_t e) {
    runKernelBf16(build, pBf16 + b, pMaster ? pMaster + b : nullptr, g + b, m + b, v + b, e - b, c);
  });
}

void adamStepBf16(uint16_t* pBf16, float* pMaster, const float* g, float* m, float* v,
                  int64_t n, int64_t step, const AdamParams& params, int threads) {
  adamStepBf16With(isaBest(), pBf16, pMaster, g, m, v, n, step, params, threads);
}

// --- CpuAdam ---

void CpuAdam::AlignedFree::operator()(float* ptr) const { std::free(ptr); }

CpuAdam::CpuAdam(AdamParams params, int threads) : params_(params), threads_(threads) {
  LT_CHECK(threads >= 1, "CpuAdam: threads = ", threads, "; expected at least 1");
  // Validate the hyper-parameters now rather than at the first step.
  const float probe = 0;
  checkArgs(&probe, &probe, &probe, &probe, 0, 1, params_);
}

CpuAdam::~CpuAdam() = default;

CpuAdam::Buffer CpuAdam::allocBuffer(int64_t numel) {
  // aligned_alloc wants a multiple of the alignment.
  const size_t bytes = (static_cast<size_t>(numel) * sizeof(float) + 63) / 64 * 64;
  Buffer b(static_cast<float*>(std::aligned_alloc(64, bytes)));
  LT_CHECK(b != nullptr, "CpuAdam: cannot allocate ", bytes, " bytes for a group of ", numel, " elements");
  std::memset(b.get(), 0, bytes);
  return b;
}

int CpuAdam::addGroup(int64_t numel, std::vector<DecaySpan> decay) {
  LT_CHECK(numel > 0, "CpuAdam::addGroup: numel = ", numel, "; expected a positive count");
  if (decay.empty()) decay.push_back({0, numel, params_.weightDecay});
  Group g;
  int64_t end = 0;
  for (const auto& d : decay) {
    LT_CHECK(d.offset == end && d.length >= 0 && d.weightDecay >= 0 && std::isfinite(d.weightDecay),
             "CpuAdam::addGroup: decay span [", d.offset, ", +", d.length, ") wd ", d.weightDecay,
             " does not continue the spans before it at ", end, " with a finite decay >= 0");
    end += d.length;
    if (d.length == 0) continue;
    if (!g.decay.empty() && g.decay.back().weightDecay == d.weightDecay) g.decay.back().length += d.length;
    else g.decay.push_back(d);
  }
  LT_CHECK(end == numel, "CpuAdam::addGroup: decay spans cover ", end, " of ", numel, " elements");
  g.m = allocBuffer(numel);
  g.v = allocBuffer(numel);
  g.numel = numel;
  groups_.push_back(std::move(g));
  return static_cast<int>(groups_.size()) - 1;
}

CpuAdam::Group& CpuAdam::groupAt(int group) {
  LT_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "CpuAdam: group ", group,
           " does not exist; ", groups_.size(), " groups were added");
  return groups_[group];
}

const CpuAdam::Group& CpuAdam::groupAt(int group) const {
  return const_cast<CpuAdam*>(this)->groupAt(group);
}

template <typename Fn>
void CpuAdam::forEachSpan(const Group& g, Fn fn) const {
  AdamParams p = params_;
  for (const auto& d : g.decay) {
    p.weightDecay = d.weightDecay;
    fn(d.offset, d.length, p);
  }
}

void CpuAdam::step(int group, float* p, const float* g) {
  Group& gr = groupAt(group);
  checkArgs(p, g, gr.m.get(), gr.v.get(), gr.numel, gr.step + 1, params_);
  ++gr.step;
  float *m = gr.m.get(), *v = gr.v.get();
  forEachSpan(gr, [&](int64_t o, int64_t n, const AdamParams& ap) {
    adamStep(p + o, g + o, m + o, v + o, n, gr.step, ap, threads_);
  });
}

void CpuAdam::stepBf16(int group, uint16_t* pBf16, float* pMaster, const float* g) {
  Group& gr = groupAt(group);
  checkArgs(pBf16, g, gr.m.get(), gr.v.get(), gr.numel, gr.step + 1, params_);
  ++gr.step;
  float *m = gr.m.get(), *v = gr.v.get();
  forEachSpan(gr, [&](int64_t o, int64_t n, const AdamParams& ap) {
    adamStepBf16(pBf16 + o, pMaster ? pMaster + o : nullptr, g + o, m + o, v + o, n, gr.step, ap, threads_);
  });
}

void CpuAdam::stepSpeculative(int group, const float* p, const float* g, float* pOut) {
  Group& gr = groupAt(group);
  if (!gr.mShadow) {
    gr.mShadow = allocBuffer(gr.numel);
    gr.vShadow = allocBuffer(gr.numel);
  }
  float *m = gr.m.get(), *v = gr.v.get(), *ms = gr.mShadow.get(), *vs = gr.vShadow.get();
  forEachSpan(gr, [&](int64_t o, int64_t n, const AdamParams& ap) {
    adamStepInto(p + o, m + o, v + o, g + o, pOut + o, ms + o, vs + o, n, gr.step + 1, ap, threads_);
  });
}

void CpuAdam::commitSpeculative(int group) {
  Group& gr = groupAt(group);
  LT_ASSERT(gr.mShadow != nullptr, "commitSpeculative without a speculative step");
  std::swap(gr.m, gr.mShadow);
  std::swap(gr.v, gr.vShadow);
  ++gr.step;
}

int CpuAdam::groupCount() const { return static_cast<int>(groups_.size()); }
int64_t CpuAdam::groupNumel(int group) const { return groupAt(group).numel; }
float* CpuAdam::expAvg(int group) { return groupAt(group).m.get(); }
float* CpuAdam::expAvgSq(int group) { return groupAt(group).v.get(); }
int64_t CpuAdam::stepCount(int group) const { return groupAt(group).step; }

void CpuAdam::setStepCount(int group, int64_t step) {
  LT_CHECK(step >= 0, "CpuAdam::setStepCount: step = ", step, "; expected >= 0");
  groupAt(group).step = step;
}

void CpuAdam::setLr(double lr) {
  LT_CHECK(lr >= 0 && std::isfinite(lr), "CpuAdam::setLr: lr = ", lr,
           "; expected a finite value >= 0");
  params_.lr = lr;
}

}  // namespace lt::kernels
