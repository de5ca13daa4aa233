// The kernels' equivalence table, after ggml's test-backend-ops: one row per (op, ISA) pair of
// every CPU kernel family (attention, pointwise, CPU Adam), each run against its reference element
// by element within a tolerance of testing.h's table; a pair this CPU cannot run is skipped with
// the reason. Non-obvious: Avx512Bf16 rows run the fp32 families' Avx512 builds through the
// dispatch (what isaBest() gives such a CPU), and only attention_bf16 has a build of its own there.
// The per-family tests (attention_test, fused_ops_test, kernels_cpu_adam_test, gemm_test) keep the
// wider sweeps: more shapes, masks, thread counts, error paths.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "longtrain/core/torch_compat.h"
#include "longtrain/kernels/cpu_adam.h"
#include "longtrain/kernels/fused_attention.h"
#include "longtrain/kernels/fused_ops.h"
#include "longtrain/kernels/isa.h"
#include "longtrain/model/attention.h"
#include "longtrain/model/model.h"
#include "testing.h"

namespace {

using lt::kernels::Isa;
using lt::testing::relErr;
using lt::testing::Tol;

at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// Runs f on clones of the inputs that require grad, backpropagates sum(f * up), and returns the
// output then each input's gradient.
std::vector<at::Tensor> withGrads(const std::vector<at::Tensor>& inputs, const at::Tensor& up,
                                  const std::function<at::Tensor(std::vector<at::Tensor>&)>& f) {
  std::vector<at::Tensor> xs;
  for (const auto& x : inputs) xs.push_back(x.clone().requires_grad_(true));
  auto out = f(xs);
  (out * up).sum().backward();
  std::vector<at::Tensor> r{out.detach()};
  for (const auto& x : xs) r.push_back(x.grad());
  return r;
}

// Element by element: max |got - want| over the largest |want| (relErr), per tensor.
void expectClose(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double tol,
                 size_t first = 0) {
  for (size_t i = first; i < want.size(); ++i) EXPECT_LE(relErr(got[i], want[i]), tol) << "tensor " << i;
}

// --- attention: q [B, S, H, D], k, v [B, S, KV, D]; GQA, tails of every vector width, partial tiles.
const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>> kAttentionShapes = {
    {2, 19, 4, 2, 8, 5}, {1, 130, 4, 1, 16, 64}, {2, 97, 6, 3, 32, 16}, {1, 40, 4, 2, 128, 0}};

void attention(Isa isa, bool backward, bool bf16) {
  auto g = gen(11);
  for (auto [B, S, H, KV, D, T] : kAttentionShapes) {
    SCOPED_TRACE(::testing::Message() << "B" << B << " S" << S << " H" << H << "/" << KV << " D" << D << " tile" << T);
    auto q = at::randn({B, S, H, D}, g), k = at::randn({B, S, KV, D}, g), v = at::randn({B, S, KV, D}, g);
    auto up = at::randn({B, S, H, D}, g);
    lt::kernels::FusedAttentionOptions o;
    o.isa = isa, o.tile = T, o.bf16 = bf16;
    auto want = withGrads({q, k, v}, up, [](auto& x) { return lt::model::causalAttention(x[0], x[1], x[2]); });
    auto got = withGrads({q, k, v}, up, [&](auto& x) { return lt::kernels::fusedAttention(x[0], x[1], x[2], o); });
    const double tol = bf16 ? Tol::kBf16Attention : Tol::kFusedKernel;
    if (backward) expectClose(got, want, tol, 1);
    else expectClose({got[0]}, {want[0]}, tol);
  }
}

// --- pointwise: odd widths leave vector tails; 130 rows leave a partial 64-row chunk.
void rmsNorm(Isa isa, bool backward) {
  auto g = gen(21);
  for (auto [rows, D] : std::vector<std::pair<int64_t, int64_t>>{{130, 37}, {65, 256}, {1, 5}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << D);
    auto x = at::randn({rows, D}, g) * 3, w = at::randn({D}, g), up = at::randn({rows, D}, g);
    auto want = withGrads({x, w}, up, [](auto& t) { return lt::model::rmsNorm(t[0], t[1], 1e-5); });
    auto got = withGrads({x, w}, up, [&](auto& t) { return lt::kernels::fusedRmsNorm(t[0], t[1], 1e-5, isa); });
    if (backward) expectClose(got, want, Tol::kFusedKernel, 1);
    else expectClose({got[0]}, {want[0]}, Tol::kFusedKernel);
  }
}

at::Tensor swigluReference(const at::Tensor& gu) {
  const int64_t F = gu.size(-1) / 2;
  return at::silu(gu.narrow(-1, 0, F)) * gu.narrow(-1, F, F);
}

// saveBf16: the gradient is the reference's at gu rounded to bf16 (the output is the fp32 one).
void swiglu(Isa isa, bool backward, bool saveBf16) {
  auto g = gen(22);
  for (auto [rows, F] : std::vector<std::pair<int64_t, int64_t>>{{67, 19}, {2, 704}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << F);
    auto gu = at::randn({rows, 2 * F}, g) * 4, up = at::randn({rows, F}, g);
    auto refIn = saveBf16 ? gu.to(at::kBFloat16).to(at::kFloat) : gu;
    auto want = withGrads({refIn}, up, [](auto& t) { return swigluReference(t[0]); });
    auto got = withGrads({gu}, up, [&](auto& t) { return lt::kernels::fusedSwiglu(t[0], isa, saveBf16); });
    if (backward) expectClose(got, want, Tol::kFusedKernel, 1);
    else expectClose({got[0]}, {want[0]}, Tol::kFusedKernel);  // forward rows run with saveBf16 off
  }
}

// Read in place from a column slice of a wider tensor (the one q/k/v GEMM's output).
void rope(Isa isa, bool backward) {
  auto g = gen(25);
  for (auto [H, Dh] : std::vector<std::pair<int64_t, int64_t>>{{3, 6}, {2, 64}}) {
    SCOPED_TRACE(::testing::Message() << "H" << H << " Dh" << Dh);
    const int64_t B = 2, S = 37, width = H * Dh;
    auto wide = at::randn({B, S, 3 * width}, g), up = at::randn({B, S, H, Dh}, g);
    auto pos = at::randint(0, 1000, {B, S}, g);
    const auto table = lt::model::ropeTable(pos, Dh, 10000.0);
    auto slice = [&](const at::Tensor& w) { return w.narrow(-1, width, width).reshape({B, S, H, Dh}); };
    auto want = withGrads({wide}, up, [&](auto& t) { return lt::model::rope(slice(t[0]), pos, 10000.0); });
    auto got = withGrads({wide}, up, [&](auto& t) { return lt::kernels::fusedRope(slice(t[0]), table, isa); });
    if (backward) expectClose(got, want, Tol::kFusedKernel, 1);
    else expectClose({got[0]}, {want[0]}, Tol::kFusedKernel);
  }
}

// The bf16 GEMM route's conversion: c10::BFloat16's scalar rounding, bit for bit (ATen's
// vectorized .to() writes NaN as 0xFFFF, so it is not the oracle): an odd length (the tail),
// subnormals, ties, the largest floats, infinities, NaN. In place: over the input's first half.
void toBf16(Isa isa, bool inPlace) {
  auto x = at::cat({at::randn({100003}, gen(31)) * 100, at::randn({64}, gen(32)) * 1e-39,
                    at::tensor({1.00390625f, 1.01171875f, 3.4028235e38f, -3.4028235e38f, INFINITY, -INFINITY, NAN,
                                0.0f, -0.0f})});
  const auto got = inPlace ? lt::kernels::toBf16InPlace(x.clone(), isa) : lt::kernels::toBf16(x, isa);
  ASSERT_EQ(got.scalar_type(), at::kBFloat16);
  ASSERT_EQ(got.numel(), x.numel());
  const float* xp = x.data_ptr<float>();
  const auto* g = reinterpret_cast<const uint16_t*>(got.data_ptr<at::BFloat16>());
  int64_t wrong = 0;
  for (int64_t i = 0; i < x.numel(); ++i) wrong += g[i] != c10::BFloat16(xp[i]).x;
  EXPECT_EQ(wrong, 0);
}

// --- The polynomial exps (the sigmoid's vexp, the attention softmax's vexp2) against libm's in
// double, in units in the last place of the exact value: 2^21 evenly spaced points over each
// one's range (every binade from the smallest normal result up), and below it the clamp.
void exps(Isa isa, bool base2) {
  const auto kernel = base2 ? lt::kernels::kernelExp2 : lt::kernels::kernelExp;
  const double lo = base2 ? -125.0 : -87.0, hi = base2 ? 126.0 : 88.0;
  const auto x = at::linspace(lo, hi, 1 << 21, at::kDouble).to(at::kFloat);
  const auto got = kernel(x, isa);
  const float *xp = x.data_ptr<float>(), *g = got.data_ptr<float>();
  double worst = 0, worstAt = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double exact = base2 ? std::exp2(static_cast<double>(xp[i])) : std::exp(static_cast<double>(xp[i]));
    const double ulps = std::fabs(g[i] - exact) / std::ldexp(1.0, std::ilogb(exact) - 23);
    if (ulps > worst) worst = ulps, worstAt = xp[i];
  }
  EXPECT_LE(worst, Tol::kPolynomialExpUlps) << "at x = " << worstAt;
  // Below the range: the clamp's value, a normal float (2^-125, exp(-87)), never 0 or a NaN.
  const auto tail = kernel(at::full({3}, -1000.0f), isa);
  const double want = base2 ? std::exp2(-125.0) : std::exp(-87.0);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(tail[i].item<float>(), want, want * 1e-6);
}

// --- The LM head's softmax cross-entropy in place, against ATen's log_softmax in double: each
// row's loss, its argmax (the first maximum: a row of equal logits gives 0) and, after the
// gradient pass, (softmax - onehot) * scale with a zero scale for an ignored row. Widths with and
// without vector tails, logits up to +-30, and a row of negative logits close together, where a
// tail's padding that reached the maximum or the sum would show.
void softmaxCrossEntropy(Isa isa, bool grad) {
  for (auto [T, V] : {std::pair<int64_t, int64_t>{7, 1000}, {5, 8192}, {9, 17}, {3, 1}}) {
    auto x = at::randn({T, V}, gen(41 + V)) * 10;
    x[0].fill_(0.5f);  // ties: the first index wins
    if (T > 1) x[1] = at::randn({V}, gen(44)) * 0.1 - 5;  // all below a tail's zero padding
    const auto target = at::randint(V, {T}, gen(42), at::kLong);
    const auto scale = at::rand({T}, gen(43)).index_put_({at::tensor({T - 1})}, 0.0f);
    auto p = x.clone();
    const auto rows = lt::kernels::softmaxCrossEntropyInPlace(p, target, isa);
    const auto logp = at::log_softmax(x.to(at::kDouble), 1);
    const auto what = std::to_string(T) + " x " + std::to_string(V);
    if (!grad) {
      EXPECT_LE(relErr(rows.loss.to(at::kDouble), -logp.gather(1, target.unsqueeze(1)).squeeze(1)), Tol::kFusedKernel)
          << what;
      auto want = at::argmax(x, 1);
      want[0] = 0;
      EXPECT_TRUE(at::equal(rows.argmax, want)) << what;
      continue;
    }
    lt::kernels::softmaxCrossEntropyGradInPlace(p, target, rows.invSum, scale, isa);
    auto want = logp.exp();
    want.scatter_add_(1, target.unsqueeze(1), at::full({T, 1}, -1.0, want.options()));
    want.mul_(scale.to(at::kDouble).unsqueeze(1));
    EXPECT_LE(relErr(p.to(at::kDouble), want), Tol::kFusedKernel) << what;
    EXPECT_TRUE(at::equal(p[T - 1], at::zeros({V}))) << what << ": the ignored row";
  }
}

// --- CPU Adam against torch::optim::AdamW: 10 steps, sizes with and without vector tails.
struct AdamState {
  at::Tensor p, m, v;
};

AdamState torchAdamW(const lt::kernels::AdamParams& a, const at::Tensor& p0, const std::vector<at::Tensor>& grads) {
  at::Tensor p = p0.clone().set_requires_grad(true);
  torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(a.lr)
                                   .betas(std::make_tuple(a.beta1, a.beta2))
                                   .eps(a.eps)
                                   .weight_decay(a.weightDecay));
  for (const auto& g : grads) {
    p.mutable_grad() = g.clone();
    opt.step();
  }
  auto& s = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(lt::compat::optimizerStateKey(p)));
  return {p.detach(), s.exp_avg(), s.exp_avg_sq()};
}

// |a - b| / max(1, |b|), element by element (the states reach ~30, where an ulp is ~2e-6).
double stateErr(const at::Tensor& a, const at::Tensor& b) {
  auto bd = b.to(at::kDouble);
  return ((a.to(at::kDouble) - bd).abs() / bd.abs().clamp_min(1.0)).max().item<double>();
}

void adam(Isa isa, bool bf16) {
  at::manual_seed(1234);
  lt::kernels::AdamParams a;
  a.lr = 1e-3, a.weightDecay = 0.1;
  for (int64_t n : {22, 1031}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const auto p0 = at::randn({n});
    std::vector<at::Tensor> grads;
    for (int t = 0; t < 10; ++t) grads.push_back(at::randn({n}));
    AdamState s{p0.clone(), at::zeros({n}), at::zeros({n})};
    std::vector<uint16_t> copy(n);
    for (int t = 0; t < 10; ++t) {
      float *p = s.p.data_ptr<float>(), *m = s.m.data_ptr<float>(), *v = s.v.data_ptr<float>();
      const float* g = grads[t].data_ptr<float>();
      if (bf16) lt::kernels::adamStepBf16With(isa, copy.data(), p, g, m, v, n, t + 1, a, 1);
      else lt::kernels::adamStepWith(isa, p, g, m, v, n, t + 1, a, 1);
    }
    if (bf16) {  // the master is the fp32 step's, the copy its round-to-nearest-even
      const auto rounded = s.p.to(at::kBFloat16);
      EXPECT_EQ(std::memcmp(copy.data(), rounded.data_ptr(), 2 * n), 0);
    }
    const auto want = torchAdamW(a, p0, grads);
    EXPECT_LE((s.p - want.p).abs().max().item<double>(), Tol::kAdamParamAbs);
    EXPECT_LE(stateErr(s.m, want.m), Tol::kAdamStateRel);
    EXPECT_LE(stateErr(s.v, want.v), Tol::kAdamStateRel);
  }
}

// --- the table
struct Op {
  const char* name;
  std::function<void(Isa)> run;
  std::vector<Isa> isas;  // the ISAs the op dispatches (every one unless it has one build only)
};

const std::vector<Isa> kEvery(std::begin(lt::kernels::kIsas), std::end(lt::kernels::kIsas));

const std::vector<Op>& ops() {
  static const std::vector<Op> table = {
      {"attention_forward", [](Isa i) { attention(i, false, false); }, kEvery},
      {"attention_backward", [](Isa i) { attention(i, true, false); }, kEvery},
      {"attention_bf16_forward", [](Isa i) { attention(i, false, true); }, {Isa::Avx512Bf16}},
      {"attention_bf16_backward", [](Isa i) { attention(i, true, true); }, {Isa::Avx512Bf16}},
      {"rmsnorm_forward", [](Isa i) { rmsNorm(i, false); }, kEvery},
      {"rmsnorm_backward", [](Isa i) { rmsNorm(i, true); }, kEvery},
      {"swiglu_forward", [](Isa i) { swiglu(i, false, false); }, kEvery},
      {"swiglu_backward", [](Isa i) { swiglu(i, true, false); }, kEvery},
      {"swiglu_backward_saved_bf16", [](Isa i) { swiglu(i, true, true); }, kEvery},
      {"rope_forward", [](Isa i) { rope(i, false); }, kEvery},
      {"rope_backward", [](Isa i) { rope(i, true); }, kEvery},
      {"to_bf16", [](Isa i) { toBf16(i, false); }, kEvery},
      {"to_bf16_in_place", [](Isa i) { toBf16(i, true); }, kEvery},
      {"exp", [](Isa i) { exps(i, false); }, kEvery},
      {"exp2", [](Isa i) { exps(i, true); }, kEvery},
      {"softmax_cross_entropy", [](Isa i) { softmaxCrossEntropy(i, false); }, kEvery},
      {"softmax_cross_entropy_grad", [](Isa i) { softmaxCrossEntropy(i, true); }, kEvery},
      {"adam", [](Isa i) { adam(i, false); }, kEvery},
      {"adam_bf16_copy", [](Isa i) { adam(i, true); }, kEvery},
  };
  return table;
}

std::vector<std::pair<size_t, Isa>> pairs() {
  std::vector<std::pair<size_t, Isa>> out;
  for (size_t o = 0; o < ops().size(); ++o)
    for (Isa isa : ops()[o].isas) out.emplace_back(o, isa);
  return out;
}

class KernelEquivalence : public ::testing::TestWithParam<std::pair<size_t, Isa>> {};

TEST_P(KernelEquivalence, MatchesReference) {
  const auto [op, isa] = GetParam();
  if (!lt::kernels::isaSupported(isa))
    GTEST_SKIP() << ops()[op].name << " on " << lt::kernels::isaName(isa) << ": this CPU lacks its instructions";
  ops()[op].run(isa);
}

INSTANTIATE_TEST_SUITE_P(Kernels, KernelEquivalence, ::testing::ValuesIn(pairs()),
                         [](const ::testing::TestParamInfo<std::pair<size_t, Isa>>& i) {
                           return std::string(ops()[i.param.first].name) + "_" + lt::kernels::isaName(i.param.second);
                         });

// The table lists every ISA (a new one must get its rows), and the dispatch's choice is a
// supported ISA from which every narrower one is supported too.
TEST(KernelsIsa, BestIsSupportedAndNamed) {
  EXPECT_EQ(kEvery.size(), 4u);
  const Isa best = lt::kernels::isaBest();
  for (Isa isa : kEvery) EXPECT_EQ(lt::kernels::isaSupported(isa), isa <= best) << lt::kernels::isaName(isa);
  EXPECT_STREQ(lt::kernels::isaName(Isa::Baseline), "baseline");
  EXPECT_STREQ(lt::kernels::isaName(Isa::Avx512Bf16), "avx512bf16");
}

}  // namespace
