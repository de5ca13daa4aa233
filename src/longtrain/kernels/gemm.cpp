// The model's GEMMs under autograd (gemm.h): OpenBLAS through ATen's addmm, fp32 through oneDNN's
// dnnl_sgemm, bf16 through its matmul primitive with an fp32 result. Row-major throughout: the
// backward's two products read the saved operands in place, with transposes as flags.
// Non-obvious: the bf16 route saves the bf16 copies of x and w for backward (half the bytes of
// fp32) and never rounds a result or gradient to bf16.
#include "longtrain/kernels/gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dnnl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>

#include "longtrain/core/check.h"
#include "longtrain/core/cpu.h"
#include "longtrain/core/torch_compat.h"
#include "longtrain/core/trace.h"
#include "longtrain/kernels/footprint.h"
#include "longtrain/kernels/fused_ops.h"

namespace lt::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// c [M, N] = op(a) op(b) + beta c, all row-major and contiguous; op(a) is [M, K], op(b) [K, N].
void sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const at::Tensor& a, const at::Tensor& b,
           const at::Tensor& c, float beta = 0.0f) {
  LT_ASSERT(a.is_contiguous() && b.is_contiguous() && c.is_contiguous() && a.scalar_type() == at::kFloat &&
            b.scalar_type() == at::kFloat);
  const dnnl_status_t s = dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', M, N, K, 1.0f, a.data_ptr<float>(),
                                     transA ? M : K, b.data_ptr<float>(), transB ? K : N, beta, c.data_ptr<float>(), N);
  LT_CHECK(s == dnnl_success, "oneDNN sgemm failed (status ", static_cast<int>(s), ") on [", M, ", ", K, "] x [", K,
           ", ", N, "]; set model.gemm=\"blas\" to use OpenBLAS");
}

// Rows of c that one OpenBLAS call computes. OpenBLAS packs a [K block x c's rows] panel into
// per-thread buffers it never returns: a call whose result has R rows leaves up to ~R KiB of them
// resident (K blocks of 256 floats on Zen), outside the allocator the plan counts. Measured on
// Zen 2: 16 MiB for a 16K-token projection, 31 MiB for the LM head's [32000, 256] weight
// gradient; at that rate 400K tokens would fill the buffers (128-256 MiB; not run). Blocks of
// 4096 rows keep it near 4 MiB a buffer and each call as large as the MLP's.
constexpr int64_t kBlasRowBlock = 4096;

// c += opA opB (beta = 1) on ATen's BLAS, kBlasRowBlock rows of c a call; c contiguous.
void addProductInRowBlocks(const at::Tensor& c, const at::Tensor& opA, const at::Tensor& opB) {
  const int64_t M = c.size(0);
  for (int64_t s = 0; s < M; s += kBlasRowBlock) {
    const int64_t n = std::min(kBlasRowBlock, M - s);
    c.narrow(0, s, n).addmm_(opA.narrow(0, s, n), opB);
  }
}

// The bf16 matmul for one shape: oneDNN's primitive (AVX512_BF16 or AMX kernels where the CPU has
// them), with a user scratchpad so that thread-ranks running at once share nothing.
struct Bf16Matmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

const dnnl::engine& cpuEngine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

std::atomic<bool> widenedBf16ForTesting{false};

// nullptr where oneDNN has no bf16 matmul for this CPU but its reference one (2.6's own kernels
// need AVX-512). `accumulate`: c += the product (oneDNN's sum post-op), no product-sized temporary.
const Bf16Matmul* bf16Matmul(bool transA, bool transB, int64_t M, int64_t N, int64_t K, bool accumulate = false) {
  using dt = dnnl::memory::data_type;
  // Per thread (each thread-rank builds its own); a run has a handful of shapes, generation one per
  // prompt length, so the cache is bounded by dropping it whole.
  thread_local std::map<std::tuple<bool, bool, int64_t, int64_t, int64_t, bool>, std::unique_ptr<Bf16Matmul>> cache;
  const auto key = std::make_tuple(transA, transB, M, N, K, accumulate);
  if (auto it = cache.find(key); it != cache.end()) return it->second.get();
  if (cache.size() >= 64) cache.clear();
  const dnnl::memory::desc a({M, K}, dt::bf16, transA ? dnnl::memory::dims{1, M} : dnnl::memory::dims{K, 1});
  const dnnl::memory::desc b({K, N}, dt::bf16, transB ? dnnl::memory::dims{1, K} : dnnl::memory::dims{N, 1});
  const dnnl::memory::desc c({M, N}, dt::f32, dnnl::memory::dims{N, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
  std::unique_ptr<Bf16Matmul> mm;
  try {
    const auto pd = compat::matmulPrimitiveDesc<dnnl::matmul>(cpuEngine(), a, b, c, attr);
    // oneDNN's reference kernel (any CPU) runs at ~1 GFLOP/s; the BLAS on widened operands is faster.
    if (std::string(pd.impl_info_str()).rfind("ref", 0) != 0)
      mm = std::make_unique<Bf16Matmul>(Bf16Matmul{pd, dnnl::matmul(pd)});
  } catch (const dnnl::error&) {
    // left null: bf16gemm widens the operands instead
  }
  return cache.emplace(key, std::move(mm)).first->second.get();
}

// c [M, N] fp32 = op(a) op(b) (accumulate: c +=) with a, b bf16, contiguous. Without oneDNN's
// kernel, the same product on the BLAS from the operands widened to fp32 (exact; slow, so
// bf16.enabled's "only if faster" measurement never picks it; only bf16.only_if_faster=false runs it).
void bf16gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const at::Tensor& a, const at::Tensor& b,
              at::Tensor& c, bool accumulate = false) {
  LT_ASSERT(a.is_contiguous() && b.is_contiguous() && c.is_contiguous() && a.scalar_type() == at::kBFloat16 &&
            b.scalar_type() == at::kBFloat16 && c.scalar_type() == at::kFloat);
  const Bf16Matmul* mm = widenedBf16ForTesting ? nullptr : bf16Matmul(transA, transB, M, N, K, accumulate);
  if (!mm) {
    const auto wa = a.to(at::kFloat).view(transA ? at::IntArrayRef{K, M} : at::IntArrayRef{M, K});
    const auto wb = b.to(at::kFloat).view(transB ? at::IntArrayRef{N, K} : at::IntArrayRef{K, N});
    auto c2 = c.view({M, N});  // c has its caller's shape (e.g. dx: x's)
    if (accumulate) addProductInRowBlocks(c2, transA ? wa.t() : wa, transB ? wb.t() : wb);
    else at::mm_out(c2, transA ? wa.t() : wa, transB ? wb.t() : wb);
    return;
  }
  const auto& engine = cpuEngine();
  auto scratch = at::empty({static_cast<int64_t>(mm->pd.scratchpad_desc().get_size())}, at::kByte);
  thread_local dnnl::stream stream(engine);
  mm->prim.execute(stream, {{DNNL_ARG_SRC, dnnl::memory(mm->pd.src_desc(), engine, a.data_ptr())},
                            {DNNL_ARG_WEIGHTS, dnnl::memory(mm->pd.weights_desc(), engine, b.data_ptr())},
                            {DNNL_ARG_DST, dnnl::memory(mm->pd.dst_desc(), engine, c.data_ptr())},
                            {DNNL_ARG_SCRATCHPAD, dnnl::memory(mm->pd.scratchpad_desc(), engine, scratch.data_ptr())}});
  stream.wait();
}

// What a route's GEMM reads: the fp32 tensor itself, or its bf16 copy (a bf16 tensor as it is).
at::Tensor operand(const at::Tensor& t, GemmRoute route) {
  if (route != GemmRoute::Bf16 || t.scalar_type() == at::kBFloat16) return t.contiguous();
  trace::Scope ts("kernel", trace::enabled() ? "to bf16 (" + std::to_string(t.numel()) + ")" : std::string());
  return toBf16(t);
}

// Zeroes n floats; in parallel only in pieces of 4 MiB and more, so that the small outputs of a
// small model's step start no parallel region.
void zeroFloats(float* p, int64_t n) {
  constexpr int64_t kGrain = int64_t{1} << 20;
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { std::memset(p + b, 0, sizeof(float) * (e - b)); });
}

// c [M, N] = op(a) op(b) on ATen's BLAS as c zero-filled plus GEMMs with beta = 1: the same
// sums (OpenBLAS adds each block of k into c either way), without OpenBLAS 0.3.21's own pass that
// zeroes c for beta = 0 (9-18% of the quick start's samples; docs/performance.md).
void blasGemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const at::Tensor& a, const at::Tensor& b,
              at::Tensor& c) {
  LT_ASSERT(c.is_contiguous() && c.scalar_type() == at::kFloat);
  zeroFloats(c.data_ptr<float>(), M * N);
  addProductInRowBlocks(c.view({M, N}), transA ? a.view({K, M}).t() : a.view({M, K}),
                        transB ? b.view({N, K}).t() : b.view({K, N}));
}

// The trace's name for one product: "NT 2048x1024x2816" (op(a) op(b), transposed or not; M x N x K).
std::string gemmName(bool transA, bool transB, int64_t M, int64_t N, int64_t K) {
  return std::string(transA ? "T" : "N") + (transB ? "T " : "N ") + std::to_string(M) + "x" + std::to_string(N) + "x" +
         std::to_string(K);
}

void routeGemm(GemmRoute route, bool transA, bool transB, int64_t M, int64_t N, int64_t K, const at::Tensor& a,
               const at::Tensor& b, at::Tensor& c) {
  trace::Scope ts("gemm", trace::enabled() ? gemmName(transA, transB, M, N, K) : std::string());
  if (route == GemmRoute::Bf16) bf16gemm(transA, transB, M, N, K, a, b, c);
  else if (route == GemmRoute::OneDnn) sgemm(transA, transB, M, N, K, a, b, c);
  else blasGemm(transA, transB, M, N, K, a, b, c);
}

// y = x w^T on any route; saves the operands as the route reads them.
struct LinearFn : torch::autograd::Function<LinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, int64_t route) {
    LT_CHECK(x.size(-1) == w.size(1), "linear: input width ", x.size(-1), " does not match the weight's ", w.size(1));
    const auto r = static_cast<GemmRoute>(route);
    const auto xo = operand(x, r), wo = operand(w, r);
    const int64_t K = w.size(1), N = w.size(0), M = xo.numel() / K;
    auto sizes = x.sizes().vec();
    sizes.back() = N;
    auto y = at::empty(sizes, x.options().dtype(at::kFloat));
    routeGemm(r, false, true, M, N, K, xo, wo, y);
    ctx->save_for_backward({xo, wo});
    ctx->saved_data["route"] = route;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const auto r = static_cast<GemmRoute>(ctx->saved_data["route"].toInt());
    const auto dy = operand(grads[0], r);
    const int64_t K = w.size(1), N = w.size(0), M = x.numel() / K;
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = at::empty(x.sizes(), x.options().dtype(at::kFloat));
      routeGemm(r, false, false, M, K, N, dy, w, dx);  // [M, N] x [N, K]
    }
    if (ctx->needs_input_grad(1)) {
      dw = at::empty(w.sizes(), w.options().dtype(at::kFloat));
      routeGemm(r, true, false, N, K, M, dy, x, dw);  // [N, M] x [M, K]
    }
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

double bf16GemmWorkBytes(bool transA, bool transB, double M, double N, double K, bool accumulate) {
  const auto m = static_cast<int64_t>(M), n = static_cast<int64_t>(N), k = static_cast<int64_t>(K);
  const Bf16Matmul* mm = widenedBf16ForTesting ? nullptr : bf16Matmul(transA, transB, m, n, k, accumulate);
  if (!mm) return 4 * (M * K + K * N);
  return static_cast<double>(mm->pd.scratchpad_desc().get_size());
}

void forceWidenedBf16ForTesting(bool on) { widenedBf16ForTesting = on; }

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, GemmRoute route) {
  return LinearFn::apply(x, w, static_cast<int64_t>(route));
}

void matmulInto(at::Tensor& out, const at::Tensor& a, bool transA, const at::Tensor& b, bool transB, GemmRoute route) {
  LT_ASSERT(a.dim() == 2 && b.dim() == 2 && out.is_contiguous());
  const auto opA = transA ? a.t() : a, opB = transB ? b.t() : b;
  LT_ASSERT(opA.size(1) == opB.size(0) && out.size(0) == opA.size(0) && out.size(1) == opB.size(1));
  routeGemm(route, transA, transB, opA.size(0), opB.size(1), opA.size(1), operand(a, route), operand(b, route), out);
}

void matmulAccumulate(at::Tensor& out, const at::Tensor& a, bool transA, const at::Tensor& b, bool transB, GemmRoute route) {
  LT_ASSERT(a.dim() == 2 && b.dim() == 2 && out.is_contiguous());
  const int64_t M = out.size(0), N = out.size(1), K = a.size(transA ? 0 : 1);
  LT_ASSERT(b.size(transB ? 1 : 0) == K);
  trace::Scope ts("gemm", trace::enabled() ? gemmName(transA, transB, M, N, K) + " +=" : std::string());
  if (route == GemmRoute::Blas) return addProductInRowBlocks(out, transA ? a.t() : a, transB ? b.t() : b);
  if (route == GemmRoute::Bf16) return bf16gemm(transA, transB, M, N, K, operand(a, route), operand(b, route), out, true);
  sgemm(transA, transB, M, N, K, a.contiguous(), b.contiguous(), out, 1.0f);
}

bool oneDnnIsTheFp32Default() { return cpuIsa().avx2Fma; }

at::Tensor matmul(const at::Tensor& a, bool transA, const at::Tensor& b, bool transB, GemmRoute route) {
  auto out = at::empty({a.size(transA ? 1 : 0), b.size(transB ? 0 : 1)}, a.options().dtype(at::kFloat));
  matmulInto(out, a, transA, b, transB, route);
  return out;
}

}  // namespace lt::kernels
