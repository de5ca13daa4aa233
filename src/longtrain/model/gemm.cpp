// oneDNN's sgemm under autograd (gemm.h). Row-major throughout, as dnnl_sgemm is: the
// backward's two products read the saved x and w in place, with transposes as flags.
#include "longtrain/model/gemm.h"

#include <ATen/ATen.h>
#include <dnnl.h>
#include <torch/csrc/autograd/custom_function.h>

#include "longtrain/core/check.h"

namespace lt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// c [M, N] = op(a) op(b), all row-major and contiguous; op(a) is [M, K], op(b) [K, N].
void sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const at::Tensor& a, const at::Tensor& b,
           at::Tensor& c) {
  LT_ASSERT(a.is_contiguous() && b.is_contiguous() && c.is_contiguous() && a.scalar_type() == at::kFloat &&
            b.scalar_type() == at::kFloat);
  const dnnl_status_t s = dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', M, N, K, 1.0f, a.data_ptr<float>(),
                                     transA ? M : K, b.data_ptr<float>(), transB ? K : N, 0.0f, c.data_ptr<float>(), N);
  LT_CHECK(s == dnnl_success, "oneDNN sgemm failed (status ", static_cast<int>(s), ") on [", M, ", ", K, "] x [", K,
           ", ", N, "]; set model.gemm=\"blas\" to use OpenBLAS");
}

struct OneDnnLinearFn : torch::autograd::Function<OneDnnLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    LT_CHECK(x.size(-1) == w.size(1), "linear: input width ", x.size(-1), " does not match the weight's ", w.size(1));
    const auto xc = x.contiguous(), wc = w.contiguous();
    const int64_t K = w.size(1), N = w.size(0), M = xc.numel() / K;
    auto sizes = x.sizes().vec();
    sizes.back() = N;
    auto y = at::empty(sizes, x.options());
    sgemm(false, true, M, N, K, xc, wc, y);
    ctx->save_for_backward({xc, wc});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const auto dy = grads[0].contiguous();
    const int64_t K = w.size(1), N = w.size(0), M = x.numel() / K;
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = at::empty_like(x);
      sgemm(false, false, M, K, N, dy, w, dx);  // [M, N] x [N, K]
    }
    if (ctx->needs_input_grad(1)) {
      dw = at::empty_like(w);
      sgemm(true, false, N, K, M, dy, x, dw);  // [N, M] x [M, K]
    }
    return {dx, dw};
  }
};

}  // namespace

at::Tensor oneDnnLinear(const at::Tensor& x, const at::Tensor& w) { return OneDnnLinearFn::apply(x, w); }

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, GemmRoute route) {
  switch (route) {
    case GemmRoute::Blas: return at::linear(x, w);
    case GemmRoute::OneDnn: return oneDnnLinear(x, w);
    case GemmRoute::Bf16: break;
  }
  return at::linear(x.to(at::kBFloat16), w.to(at::kBFloat16)).to(at::kFloat);
}

void matmulInto(at::Tensor& out, const at::Tensor& a, bool transA, const at::Tensor& b, bool transB, GemmRoute route) {
  LT_ASSERT(a.dim() == 2 && b.dim() == 2 && out.is_contiguous());
  const auto opA = transA ? a.t() : a, opB = transB ? b.t() : b;
  LT_ASSERT(opA.size(1) == opB.size(0) && out.size(0) == opA.size(0) && out.size(1) == opB.size(1));
  if (route == GemmRoute::Blas) at::mm_out(out, opA, opB);
  else if (route == GemmRoute::Bf16) out.copy_(at::mm(opA.to(at::kBFloat16), opB.to(at::kBFloat16)));
  else sgemm(transA, transB, opA.size(0), opB.size(1), opA.size(1), a.contiguous(), b.contiguous(), out);
}

at::Tensor matmul(const at::Tensor& a, bool transA, const at::Tensor& b, bool transB, GemmRoute route) {
  auto out = at::empty({a.size(transA ? 1 : 0), b.size(transB ? 0 : 1)}, a.options().dtype(at::kFloat));
  matmulInto(out, a, transA, b, transB, route);
  return out;
}


}  // namespace lt::model
