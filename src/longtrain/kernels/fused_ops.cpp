// Fused RMSNorm, SwiGLU and RoPE: the per-ISA kernel table, the row split over ATen's threads and the
// autograd functions. Non-obvious: RMSNorm's weight gradient is summed per fixed chunk of rows
// and the chunks added in order, so it is the same at any thread count (tests rely on it).
#include "longtrain/kernels/fused_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <iterator>
#include <vector>

#include "longtrain/core/check.h"
#include "longtrain/kernels/pointwise_kernels.h"

namespace lt::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kRowChunk = 64;  // rows per task; also the unit of the weight-gradient sum

// Only the chosen build's table function runs: each is compiled with its ISA's flags, and GCC 14
// fills the returned table with AVX-512 moves in the AVX-512 build (SIGILL on an AVX2 CPU).
const pointwise_detail::Kernels& kernelsFor(int64_t isa) {
  constexpr Isa kBuilds[] = {Isa::Baseline, Isa::Avx2, Isa::Avx512};
  const auto k = static_cast<Isa>(isa);
  LT_CHECK(isaSupported(k), "fused kernels: the ", isaName(k),
           " build was requested but this CPU lacks its instructions; use isaBest()");
  switch (isaAtMost(k, std::begin(kBuilds), std::end(kBuilds))) {
    case Isa::Avx512Bf16:
    case Isa::Avx512: {
      static const auto table = pointwise_detail::kernels_avx512();
      return table;
    }
    case Isa::Avx2: {
      static const auto table = pointwise_detail::kernels_avx2();
      return table;
    }
    case Isa::Baseline: break;
  }
  static const auto table = pointwise_detail::kernels_baseline();
  return table;
}

// f(firstRow, rows) over [0, rows) in chunks of kRowChunk, on ATen's threads.
template <class F>
void forRowChunks(int64_t rows, const F& f) {
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) f(c * kRowChunk, std::min(rows, (c + 1) * kRowChunk) - c * kRowChunk);
  });
}

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, double eps, int64_t isa) {
    at::NoGradGuard ng;
    const int64_t D = x.size(-1), rows = x.numel() / D;
    auto y = at::empty_like(x), rstd = at::empty({rows}, x.options());
    const auto& k = kernelsFor(isa);
    const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
    float *yp = y.data_ptr<float>(), *sp = rstd.data_ptr<float>();
    forRowChunks(rows, [&](int64_t r0, int64_t n) {
      k.rmsNormForward(xp + r0 * D, wp, yp + r0 * D, sp + r0, n, D, static_cast<float>(eps));
    });
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["isa"] = isa;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::NoGradGuard ng;
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &rstd = saved[2];
    auto dy = grads[0].contiguous();
    const int64_t D = x.size(-1), rows = x.numel() / D, chunks = (rows + kRowChunk - 1) / kRowChunk;
    auto dx = at::empty_like(x), partial = at::zeros({chunks, D}, x.options());
    const auto& k = kernelsFor(ctx->saved_data["isa"].toInt());
    const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(), *sp = rstd.data_ptr<float>();
    const float* dyp = dy.data_ptr<float>();
    float *dxp = dx.data_ptr<float>(), *pp = partial.data_ptr<float>();
    forRowChunks(rows, [&](int64_t r0, int64_t n) {
      k.rmsNormBackward(xp + r0 * D, wp, sp + r0, dyp + r0 * D, dxp + r0 * D, pp + (r0 / kRowChunk) * D, n, D);
    });
    auto dw = partial.sum(0);  // chunk order fixed: the same at any thread count
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

// With saveBf16 the backward reads gu's bf16 copy, written in the forward's pass (half the
// saved bytes; the bf16 GEMM route rounds gu to bf16 for the next GEMM's backward anyway).
struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gu, int64_t isa, bool saveBf16) {
    at::NoGradGuard ng;
    const int64_t F = gu.size(-1) / 2, rows = gu.numel() / (2 * F);
    auto sizes = gu.sizes().vec();
    sizes.back() = F;
    auto h = at::empty(sizes, gu.options());
    const auto gu16 = saveBf16 ? at::empty(gu.sizes(), gu.options().dtype(at::kBFloat16)) : at::Tensor();
    const auto& k = kernelsFor(isa);
    const float* gp = gu.data_ptr<float>();
    float* hp = h.data_ptr<float>();
    auto* sp = saveBf16 ? reinterpret_cast<uint16_t*>(gu16.data_ptr<at::BFloat16>()) : nullptr;
    forRowChunks(rows, [&](int64_t r0, int64_t n) {
      k.swigluForward(gp + r0 * 2 * F, hp + r0 * F, sp ? sp + r0 * 2 * F : nullptr, n, F);
    });
    ctx->save_for_backward({saveBf16 ? gu16 : gu});
    ctx->saved_data["isa"] = isa;
    return h;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::NoGradGuard ng;
    const auto gu = ctx->get_saved_variables()[0];
    auto dh = grads[0].contiguous();
    const int64_t F = gu.size(-1) / 2, rows = gu.numel() / (2 * F);
    auto dgu = at::empty(gu.sizes(), dh.options());
    const auto& k = kernelsFor(ctx->saved_data["isa"].toInt());
    const float* dp = dh.data_ptr<float>();
    float* op = dgu.data_ptr<float>();
    if (gu.scalar_type() == at::kBFloat16) {
      const auto* gp = reinterpret_cast<const uint16_t*>(gu.data_ptr<at::BFloat16>());
      forRowChunks(rows, [&](int64_t r0, int64_t n) {
        k.swigluBackwardBf16(gp + r0 * 2 * F, dp + r0 * F, op + r0 * 2 * F, n, F);
      });
    } else {
      const float* gp = gu.data_ptr<float>();
      forRowChunks(rows, [&](int64_t r0, int64_t n) { k.swigluBackward(gp + r0 * 2 * F, dp + r0 * F, op + r0 * 2 * F, n, F); });
    }
    return {dgu, at::Tensor(), at::Tensor()};
  }
};

// y[i] = bf16 bits of x[i] for i in [begin, end), in tasks of kBlock elements on ATen's threads.
void toBf16Range(const pointwise_detail::Kernels& k, const float* x, uint16_t* y, int64_t begin, int64_t end) {
  constexpr int64_t kBlock = 16384;
  at::parallel_for(0, (end - begin + kBlock - 1) / kBlock, 1, [&](int64_t b0, int64_t b1) {
    const int64_t e0 = begin + b0 * kBlock, e1 = std::min(end, begin + b1 * kBlock);
    k.toBf16(x + e0, y + e0, e1 - e0);
  });
}

// Rows of x: tokens B*S, each xStride floats apart; out contiguous.
void ropeRun(const pointwise_detail::Kernels& k, const at::Tensor& x, int64_t xStride, const at::Tensor& cos,
             const at::Tensor& sin, at::Tensor& out, float sign) {
  const int64_t H = out.size(2), half = out.size(3) / 2, tokens = out.size(0) * out.size(1);
  const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  forRowChunks(tokens, [&](int64_t t0, int64_t n) {
    k.rope(xp + t0 * xStride, xStride, cp + t0 * half, sp + t0 * half, op + t0 * H * 2 * half, n, H, half, sign);
  });
}

// x's tokens at a uniform stride with heads and dims packed: what the kernel reads in place.
bool ropeReadable(const at::Tensor& x) {
  const int64_t H = x.size(2), Dh = x.size(3);
  return x.stride(3) == 1 && x.stride(2) == Dh && x.stride(1) >= H * Dh && x.stride(0) == x.size(1) * x.stride(1);
}

struct RopeFn : torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t isa) {
    at::NoGradGuard ng;
    auto out = at::empty(x.sizes(), x.options());
    ropeRun(kernelsFor(isa), x, x.stride(1), cos, sin, out, 1.0f);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["isa"] = isa;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::NoGradGuard ng;
    auto saved = ctx->get_saved_variables();
    auto dy = grads[0].contiguous();
    auto dx = at::empty_like(dy);
    ropeRun(kernelsFor(ctx->saved_data["isa"].toInt()), dy, dy.size(2) * dy.size(3), saved[0], saved[1], dx, -1.0f);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fusedRope(const at::Tensor& x, const RopeTable& table, Isa isa) {
  LT_CHECK(x.scalar_type() == at::kFloat && x.dim() == 4 && x.size(3) % 2 == 0 &&
               table.cos.sizes() == at::IntArrayRef({x.size(0), x.size(1), x.size(3) / 2}),
           "fused RoPE: fp32 x [B, S, H, Dh] and a table [B, S, Dh/2] expected, got ", x.sizes(), " and ",
           table.cos.sizes());
  return RopeFn::apply(ropeReadable(x) ? x : x.contiguous(), table.cos, table.sin, static_cast<int64_t>(isa));
}

at::Tensor fusedRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, Isa isa) {
  LT_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 1 && x.size(-1) == w.size(0),
           "fused RMSNorm: fp32 x [.., D] and w [D] expected, got ", x.sizes(), " and ", w.sizes());
  return RmsNormFn::apply(x.contiguous(), w.contiguous(), eps, static_cast<int64_t>(isa));
}

at::Tensor fusedSwiglu(const at::Tensor& gu, Isa isa, bool saveBf16) {
  LT_CHECK(gu.scalar_type() == at::kFloat && gu.size(-1) % 2 == 0,
           "fused SwiGLU: fp32 [.., 2F] (gate then up) expected, got ", gu.sizes());
  return SwigluFn::apply(gu.contiguous(), static_cast<int64_t>(isa), saveBf16);
}

at::Tensor toBf16(const at::Tensor& x, Isa isa) {
  LT_CHECK(x.scalar_type() == at::kFloat, "toBf16: fp32 expected, got ", x.scalar_type());
  const auto xc = x.contiguous();
  auto y = at::empty(xc.sizes(), xc.options().dtype(at::kBFloat16));
  toBf16Range(kernelsFor(static_cast<int64_t>(isa)), xc.data_ptr<float>(),
              reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), 0, xc.numel());
  return y;
}

at::Tensor toBf16InPlace(const at::Tensor& x, Isa isa) {
  LT_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "toBf16InPlace: contiguous fp32 expected");
  const auto& k = kernelsFor(static_cast<int64_t>(isa));
  const int64_t n = x.numel();
  float* xp = x.data_ptr<float>();
  auto* yp = reinterpret_cast<uint16_t*>(xp);
  // Element i is written to bytes [2i, 2i + 2) and read from [4i, 4i + 4). One thread converts
  // [0, first) in order (a vector's writes land on floats it or an earlier vector read); then
  // each wave [a, 2a) writes into floats [a/2, a), all read by earlier waves, so a wave's tasks
  // may run in any order.
  constexpr int64_t kFirst = 16384;
  k.toBf16(xp, yp, std::min(n, kFirst));
  for (int64_t a = kFirst; a < n; a *= 2) toBf16Range(k, xp, yp, a, std::min(n, 2 * a));
  return x.view(at::kBFloat16).reshape({-1}).narrow(0, 0, n).view(x.sizes());
}

namespace {
// Rows per task: ~64 KiB of logits a task, at least a row.
int64_t rowGrain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)); }

void checkLogitRows(const at::Tensor& x, const at::Tensor& target, const char* what) {
  LT_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), what, ": contiguous fp32 [T, V] expected");
  LT_CHECK(target.scalar_type() == at::kLong && target.is_contiguous() && target.numel() == x.size(0), what,
           ": target must be contiguous int64 [T]");
  LT_CHECK(target.numel() == 0 || (target.min().item<int64_t>() >= 0 && target.max().item<int64_t>() < x.size(1)),
           what, ": every target must lie in [0, ", x.size(1), ")");
}
}  // namespace

SoftmaxCrossEntropyRows softmaxCrossEntropyInPlace(at::Tensor& logits, const at::Tensor& target, Isa isa) {
  checkLogitRows(logits, target, "softmaxCrossEntropyInPlace");
  const auto& k = kernelsFor(static_cast<int64_t>(isa));
  const int64_t T = logits.size(0), V = logits.size(1);
  SoftmaxCrossEntropyRows out{at::empty({T}, logits.options()), at::empty({T}, target.options()),
                              at::empty({T}, logits.options())};
  float *x = logits.data_ptr<float>(), *loss = out.loss.data_ptr<float>(), *inv = out.invSum.data_ptr<float>();
  const int64_t* t = target.data_ptr<int64_t>();
  int64_t* am = out.argmax.data_ptr<int64_t>();
  at::parallel_for(0, T, rowGrain(V), [&](int64_t r0, int64_t r1) {
    k.softmaxCrossEntropy(x + r0 * V, t + r0, loss + r0, am + r0, inv + r0, r1 - r0, V);
  });
  return out;
}

void softmaxCrossEntropyGradInPlace(at::Tensor& probs, const at::Tensor& target, const at::Tensor& invSum,
                                    const at::Tensor& scale, Isa isa) {
  checkLogitRows(probs, target, "softmaxCrossEntropyGradInPlace");
  const int64_t T = probs.size(0), V = probs.size(1);
  LT_CHECK(invSum.numel() == T && scale.numel() == T && invSum.is_contiguous() && scale.is_contiguous() &&
               invSum.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat,
           "softmaxCrossEntropyGradInPlace: invSum and scale must be contiguous fp32 [T]");
  const auto& k = kernelsFor(static_cast<int64_t>(isa));
  float* x = probs.data_ptr<float>();
  const float *inv = invSum.data_ptr<float>(), *sc = scale.data_ptr<float>();
  const int64_t* t = target.data_ptr<int64_t>();
  at::parallel_for(0, T, rowGrain(V), [&](int64_t r0, int64_t r1) {
    k.softmaxCrossEntropyGrad(x + r0 * V, t + r0, inv + r0, sc + r0, r1 - r0, V);
  });
}

namespace {
at::Tensor elementwise(const at::Tensor& x, void (*f)(const float*, float*, int64_t), const char* what) {
  LT_CHECK(x.scalar_type() == at::kFloat, what, ": fp32 expected, got ", x.scalar_type());
  const auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  f(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel());
  return y;
}
}  // namespace

at::Tensor kernelExp(const at::Tensor& x, Isa isa) {
  return elementwise(x, kernelsFor(static_cast<int64_t>(isa)).exp, "kernelExp");
}
at::Tensor kernelExp2(const at::Tensor& x, Isa isa) {
  return elementwise(x, kernelsFor(static_cast<int64_t>(isa)).exp2, "kernelExp2");
}

double sumOfSquares(const at::Tensor& x) {
  LT_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "sumOfSquares: expected a contiguous fp32 tensor, got ",
           x.scalar_type(), x.is_contiguous() ? "" : " (not contiguous)");
  constexpr int64_t kBlock = 16384, kLanes = 8;  // independent sums: a compiler may vectorize them as they are
  const int64_t n = x.numel(), blocks = (n + kBlock - 1) / kBlock;
  const float* p = x.data_ptr<float>();
  std::vector<double> partial(blocks);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double lane[kLanes] = {};
      const int64_t end = std::min(n, (b + 1) * kBlock);
      int64_t i = b * kBlock;
      for (; i + kLanes <= end; i += kLanes)
        for (int64_t k = 0; k < kLanes; ++k) lane[k] += static_cast<double>(p[i + k]) * p[i + k];
      for (; i < end; ++i) lane[i % kLanes] += static_cast<double>(p[i]) * p[i];
      double s = 0;
      for (double l : lane) s += l;
      partial[b] = s;
    }
  });
  double sum = 0;
  for (double s : partial) sum += s;
  return sum;
}

}  // namespace lt::kernels
