// Fused RMSNorm, SwiGLU and RoPE against the ATen compositions in model.cpp (output and every input
// gradient, each ISA this CPU runs, odd widths that leave vector tails, rows that leave a partial
// chunk), their determinism across thread counts, and the whole model with fused kernels on and
// off (model.fused_kernels) agreeing on the loss and every parameter's gradient.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "longtrain/kernels/fused_ops.h"
#include "longtrain/model/attention.h"
#include "longtrain/model/model.h"
#include "testing.h"

namespace {

using lt::kernels::Isa;
using lt::testing::relErr;
using lt::testing::Tol;

std::vector<Isa> supportedIsas() {
  std::vector<Isa> out;
  for (auto isa : {Isa::Baseline, Isa::Avx2, Isa::Avx512})
    if (lt::kernels::isaSupported(isa)) out.push_back(isa);
  return out;
}

at::Tensor swigluReference(const at::Tensor& gu) {
  const int64_t F = gu.size(-1) / 2;
  return at::silu(gu.narrow(-1, 0, F)) * gu.narrow(-1, F, F);
}

TEST(FusedOps, RmsNormEqualsAten) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  for (auto [rows, D] : std::vector<std::pair<int64_t, int64_t>>{{3, 64}, {130, 37}, {65, 256}, {1, 5}}) {
    auto x0 = at::randn({rows, D}, gen) * 3, w0 = at::randn({D}, gen), up = at::randn({rows, D}, gen);
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    auto ref = lt::model::rmsNorm(x, w, 1e-5);
    (ref * up).sum().backward();
    for (auto isa : supportedIsas()) {
      auto xf = x0.clone().requires_grad_(true), wf = w0.clone().requires_grad_(true);
      auto got = lt::kernels::fusedRmsNorm(xf, wf, 1e-5, isa);
      (got * up).sum().backward();
      const std::string what = std::string(lt::kernels::isaName(isa)) + " " + std::to_string(rows) + "x" +
                               std::to_string(D);
      EXPECT_LE(relErr(got, ref), Tol::kFusedKernel) << what;
      EXPECT_LE(relErr(xf.grad(), x.grad()), Tol::kFusedKernel) << what;
      EXPECT_LE(relErr(wf.grad(), w.grad()), Tol::kFusedKernel) << what;
    }
  }
}

TEST(FusedOps, SwigluEqualsAten) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(22);
  for (auto [rows, F] : std::vector<std::pair<int64_t, int64_t>>{{4, 48}, {67, 19}, {2, 704}}) {
    auto gu0 = at::randn({rows, 2 * F}, gen) * 4, up = at::randn({rows, F}, gen);
    auto gu = gu0.clone().requires_grad_(true);
    auto ref = swigluReference(gu);
    (ref * up).sum().backward();
    for (auto isa : supportedIsas()) {
      auto g = gu0.clone().requires_grad_(true);
      auto got = lt::kernels::fusedSwiglu(g, isa);
      (got * up).sum().backward();
      const std::string what = std::string(lt::kernels::isaName(isa)) + " " + std::to_string(rows) + "x" +
                               std::to_string(F);
      EXPECT_LE(relErr(got, ref), Tol::kFusedKernel) << what;
      EXPECT_LE(relErr(g.grad(), gu.grad()), Tol::kFusedKernel) << what;
    }
  }
  // Large |gate|: exp's clamp keeps silu finite and exact at the ends (silu(-100) ~ 0, silu(100) = 100).
  auto ends = at::tensor(std::vector<float>{-100, 100, 1, 1}).view({1, 4});
  auto h = lt::kernels::fusedSwiglu(ends);
  EXPECT_NEAR(h[0][0].item<float>(), 0.0f, 1e-30);
  EXPECT_FLOAT_EQ(h[0][1].item<float>(), 100.0f);
}

// Under the bf16 GEMM route SwiGLU saves gu as bf16: its output is still the fp32 one, bit for
// bit, and its gradient is the ATen composition's gradient at gu rounded to bf16 (odd widths:
// the vector tail of the bf16 loads and stores), on every ISA build.
TEST(FusedOps, SwigluSavingBf16IsTheGradientAtTheRoundedInput) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  for (auto [rows, F] : std::vector<std::pair<int64_t, int64_t>>{{4, 48}, {67, 19}, {2, 704}}) {
    auto gu0 = at::randn({rows, 2 * F}, gen) * 4, up = at::randn({rows, F}, gen);
    auto rounded = gu0.to(at::kBFloat16).to(at::kFloat).requires_grad_(true);
    (swigluReference(rounded) * up).sum().backward();
    for (auto isa : supportedIsas()) {
      auto g = gu0.clone().requires_grad_(true);
      auto got = lt::kernels::fusedSwiglu(g, isa, /*saveBf16=*/true);
      (got * up).sum().backward();
      const std::string what = std::string(lt::kernels::isaName(isa)) + " " + std::to_string(rows) + "x" +
                               std::to_string(F);
      EXPECT_TRUE(at::equal(got, lt::kernels::fusedSwiglu(gu0, isa))) << what;
      EXPECT_LE(relErr(g.grad(), rounded.grad()), Tol::kFusedKernel) << what;
      // and not the fp32 gradient: the rounding shows
      auto exact = gu0.clone().requires_grad_(true);
      (lt::kernels::fusedSwiglu(exact, isa) * up).sum().backward();
      EXPECT_GT(relErr(g.grad(), exact.grad()), 1e-4) << what;
    }
  }
}

// RoPE read in place from a column slice of a wider tensor (as from the one q/k/v GEMM), with
// arbitrary positions, head dims whose half leaves a vector tail, and halves below a vector that
// pack several heads to one (whole, and with a tail of heads: 3 x 8 floats).
TEST(FusedOps, RopeEqualsAtenFromAStridedSlice) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(25);
  for (auto [H, Dh] : std::vector<std::pair<int64_t, int64_t>>{{4, 16}, {3, 6}, {2, 64}, {3, 8}, {5, 2}, {2, 32}}) {
    const int64_t B = 2, S = 37, width = H * Dh;
    auto wide0 = at::randn({B, S, 3 * width}, gen), up = at::randn({B, S, H, Dh}, gen);
    auto pos = at::randint(0, 1000, {B, S}, gen);
    auto wide = wide0.clone().requires_grad_(true);
    auto ref = lt::model::rope(wide.narrow(-1, width, width).reshape({B, S, H, Dh}), pos, 10000.0);
    (ref * up).sum().backward();
    const auto table = lt::model::ropeTable(pos, Dh, 10000.0);
    for (auto isa : supportedIsas()) {
      auto w = wide0.clone().requires_grad_(true);
      auto got = lt::kernels::fusedRope(w.narrow(-1, width, width).reshape({B, S, H, Dh}), table, isa);
      (got * up).sum().backward();
      const std::string what = std::string(lt::kernels::isaName(isa)) + " H" + std::to_string(H) + " Dh" +
                               std::to_string(Dh);
      EXPECT_LE(relErr(got, ref), Tol::kFusedKernel) << what;
      EXPECT_LE(relErr(w.grad(), wide.grad()), Tol::kFusedKernel) << what;
    }
  }
}

TEST(FusedOps, RmsNormWeightGradientIsTheSameAtAnyThreadCount) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  auto x0 = at::randn({1000, 96}, gen), w0 = at::randn({96}, gen), up = at::randn({1000, 96}, gen);
  const int before = at::get_num_threads();
  std::vector<at::Tensor> dw;
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    (lt::kernels::fusedRmsNorm(x, w, 1e-5) * up).sum().backward();
    dw.push_back(w.grad());
  }
  at::set_num_threads(before);
  EXPECT_TRUE(at::equal(dw[0], dw[1]));
}

// The gradient norm's sum of squares against ATen's float64 copy, squared and summed (what the
// optimizer computed before), for lengths that end mid-block and mid-lane; the same bits at 1 and 2 threads.
TEST(FusedOps, SumOfSquaresEqualsAtenFloat64AtAnyThreadCount) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(29);
  const int before = at::get_num_threads();
  for (int64_t n : {0, 1, 7, 16384, 16385, 100003, 1 << 20}) {
    auto x = at::randn({n}, gen) * 1e-3 + (n % 2 ? 5.0 : 0.0);
    const double want = x.to(at::kDouble).pow(2).sum().item<double>();
    std::vector<double> got;
    for (int t : {1, 2}) {
      at::set_num_threads(t);
      got.push_back(lt::kernels::sumOfSquares(x));
    }
    EXPECT_NEAR(got[0], want, Tol::kDoubleArithmetic * std::max(1.0, want)) << n;
    EXPECT_EQ(got[0], got[1]) << n;
  }
  at::set_num_threads(before);
  EXPECT_THROW(lt::kernels::sumOfSquares(at::ones({4, 4}).t()), std::exception);
}

// The whole model: fused kernels (and one GEMM for q/k/v and for gate/up) against the ATen
// composition, loss and every parameter gradient.
TEST(FusedOps, ModelWithFusedKernelsEqualsAtenComposition) {
  lt::model::ModelConfig cfg;
  cfg.vocabSize = 64, cfg.hidden = 32, cfg.layers = 2, cfg.heads = 4, cfg.kvHeads = 2, cfg.intermediate = 40;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(24);
  auto ids = at::randint(0, 64, {2, 24}, gen), labels = at::randint(0, 64, {2, 24}, gen);
  auto pos = at::arange(24, at::kLong).unsqueeze(0).expand({2, 24});
  std::vector<std::vector<at::Tensor>> grads;
  std::vector<double> losses;
  for (bool fused : {false, true}) {
    cfg.fusedKernels = fused;
    lt::model::Model m(cfg, 5);
    auto ls = lt::model::lossSum(m.forward(ids, pos, lt::model::attentionCore(cfg)), labels);
    ls.sum.backward();
    losses.push_back(ls.sum.item<double>());
    grads.emplace_back();
    for (auto& p : m.parameters()) grads.back().push_back(p.grad());
  }
  EXPECT_NEAR(losses[1], losses[0], Tol::kFusedKernel * losses[0]);
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_LE(relErr(grads[1][i], grads[0][i]), Tol::kFusedKernel) << i;
}

}  // namespace

namespace {

// The engine's defaults (fused attention, fused kernels) through Ulysses SP = 2 against the ATen
// references on one rank: the first loss (before any update) and the parameters after 3 steps.
// Adam's eps is 1e-6 for the reason given in sp_test's SpTimesDpEqualsOneRank.
TEST(FusedOps, EngineDefaultsEqualTheAtenReferenceUnderUlysses) {
  at::set_num_threads(1);
  auto cfg = lt::testing::tinyTrainConfig();
  cfg["sequence_parallel_size"] = 2;
  cfg["optimizer"]["params"]["eps"] = 1e-6;
  auto ref = cfg;
  ref.erase("sequence_parallel_size");
  ref["model"]["attention"] = "naive";
  ref["model"]["fused_kernels"] = false;
  const auto want = lt::testing::trainOnRanks(ref, 1, 1, 3)[0];
  const auto got = lt::testing::trainOnRanks(cfg, 2, 2, 3)[0];
  EXPECT_LE(std::abs(got.losses[0] - want.losses[0]) / want.losses[0], Tol::kSequenceParallel);
  for (size_t i = 0; i < want.params.size(); ++i)
    EXPECT_LE(relErr(got.params[i], want.params[i]), Tol::kAfterAdamSteps) << "parameter " << i;
}

}  // namespace

namespace {

// The LM head fused with the loss against logits() + lossSum() under autograd: loss, count,
// argmax hits, dL/dh, and the head's (or the tied embedding's) and the final norm's gradients,
// with ignored labels, untied and tied heads.
// On the bf16 route too: there the reference's logits GEMM rounds its upstream gradient to
// bf16 as the fused head rounds the logits gradient in its buffer (Tol::kBf16Rounding).
TEST(FusedOps, HeadLossEqualsLogitsThenCrossEntropy) {
  for (auto [tied, bf16] : std::vector<std::pair<bool, bool>>{{false, false}, {true, false}, {false, true}, {true, true}}) {
    lt::model::ModelConfig cfg;
    cfg.vocabSize = 50, cfg.hidden = 16, cfg.layers = 1, cfg.heads = 2, cfg.kvHeads = 2, cfg.intermediate = 24;
    cfg.tieEmbeddings = tied;
    cfg.resolved.bf16Gemms = bf16;
    const double gradTol = bf16 ? Tol::kBf16Rounding : Tol::kFusedKernel;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(26);
    auto h0 = at::randn({2, 13, 16}, gen) * 2;
    auto labels = at::randint(0, 50, {2, 13}, gen);
    labels.index_put_({0, 3}, -100);
    labels.index_put_({1, 12}, -100);
    const double scale = 0.37;
    lt::model::Model ref(cfg, 3), got(cfg, 3);
    auto h = h0.clone().requires_grad_(true);
    auto ls = lt::model::lossSum(ref.logits(h), labels);
    (ls.sum * scale).backward();
    auto tl = got.headLoss(h0, labels, scale);
    const std::string what = std::string(tied ? "tied" : "untied") + (bf16 ? ", bf16" : "");
    EXPECT_NEAR(tl.sum, ls.sum.item<double>(), Tol::kFusedKernel * ls.sum.item<double>()) << what;
    EXPECT_EQ(tl.count, ls.count) << what;
    EXPECT_EQ(tl.correct, ls.correct) << what;
    EXPECT_LE(relErr(tl.gradH, h.grad()), gradTol) << what;
    if (bf16) std::printf("bf16 head (%s): dh differs by %.3g\n", what.c_str(), relErr(tl.gradH, h.grad()));
    const auto &rg = ref.group(ref.headGroup()), &gg = got.group(got.headGroup());
    for (size_t i = 0; i < rg.size(); ++i)
      EXPECT_LE(relErr(gg[i].tensor.grad(), rg[i].tensor.grad()), gradTol) << what << " " << rg[i].name;
    if (tied) {
      const auto& re = ref.group(ref.embedGroup())[0].tensor;
      const auto& ge = got.group(got.embedGroup())[0].tensor;
      EXPECT_LE(relErr(ge.grad(), re.grad()), gradTol) << "tied embedding" << (bf16 ? ", bf16" : "");
    }
    // Without a scale: the loss only, no gradients.
    lt::model::Model evalOnly(cfg, 3);
    auto e = evalOnly.headLoss(h0, labels, 0);
    EXPECT_FALSE(e.gradH.defined());
    EXPECT_NEAR(e.sum, tl.sum, 1e-9 * tl.sum);
  }
}

// Loss tiles accumulate the head's gradient in place (matmulAccumulate): two tiles, on a
// gradient that already exists (stage 0's views of the flat buffer), against the whole
// sequence under autograd, on each fp32 route.
TEST(FusedOps, HeadLossTilesAccumulateTheWeightGradient) {
  for (bool oneDnn : {false, true}) {
    lt::model::ModelConfig cfg;
    cfg.vocabSize = 50, cfg.hidden = 16, cfg.layers = 1, cfg.heads = 2, cfg.kvHeads = 2, cfg.intermediate = 24;
    cfg.resolved.oneDnnGemm = oneDnn;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(28);
    auto h0 = at::randn({1, 20, 16}, gen) * 2;
    auto labels = at::randint(0, 50, {1, 20}, gen);
    lt::model::Model ref(cfg, 3), got(cfg, 3);
    auto h = h0.clone().requires_grad_(true);
    (lt::model::lossSum(ref.logits(h), labels).sum * 0.5).backward();
    auto& w = got.group(got.headGroup()).back().tensor;  // lm_head.weight (untied)
    w.mutable_grad() = at::zeros_like(w);
    double sum = 0;
    for (int64_t t0 : {0, 11}) {
      const int64_t n = t0 == 0 ? 11 : 9;
      sum += got.headLoss(h0.narrow(1, t0, n), labels.narrow(1, t0, n), 0.5).sum;
    }
    const std::string what = oneDnn ? "onednn" : "blas";
    EXPECT_NEAR(sum, lt::model::lossSum(ref.logits(h0), labels).sum.item<double>(), 1e-5 * sum) << what;
    const auto& rw = ref.group(ref.headGroup()).back().tensor;
    EXPECT_LE(relErr(w.grad(), rw.grad()), Tol::kFusedKernel) << what;
  }
}

}  // namespace

namespace {

// This process's resident-set high-water mark (VmHWM) in bytes, after resetting it to the
// current RSS when `reset` (clear_refs 5).
int64_t residentPeak(bool reset) {
  if (reset) std::ofstream("/proc/self/clear_refs") << "5";
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// The fused head holds one [T, V] buffer at a time, forward and backward: the peak it adds
// to the resident set, on a tile whose logits are 128 MiB, stays under 1.5 of them (logits
// then cross-entropy under autograd hold three). Fresh pages: nothing of this size was
// allocated before in this process.
// (One process per route: ctest runs each test in its own.)
class HeadLossMemory : public ::testing::TestWithParam<bool> {};

TEST_P(HeadLossMemory, HoldsOneLogitsBuffer) {
  lt::model::ModelConfig cfg;
  cfg.vocabSize = 8192, cfg.hidden = 64, cfg.layers = 1, cfg.heads = 2, cfg.kvHeads = 2, cfg.intermediate = 96;
  cfg.resolved.oneDnnGemm = GetParam();
  lt::model::Model m(cfg, 5);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(27);
  const int64_t T = 4096;
  const auto h = at::randn({1, T, cfg.hidden}, gen), labels = at::randint(0, cfg.vocabSize, {1, T}, gen);
  const double logits = static_cast<double>(T * cfg.vocabSize * 4);
  const int64_t before = residentPeak(true);
  ASSERT_GT(before, 0) << "no VmHWM in /proc/self/status";
  auto tl = m.headLoss(h, labels, 1.0 / T);
  const double added = static_cast<double>(residentPeak(false) - before);
  std::printf("[head] %s: fused head + loss, [%lld, %lld] logits of %.0f MiB: resident peak +%.0f MiB (%.2f buffers)\n",
              GetParam() ? "onednn" : "blas", (long long)T, (long long)cfg.vocabSize, logits / 1048576, added / 1048576, added / logits);
  EXPECT_TRUE(tl.gradH.defined());
  EXPECT_LT(added, 1.5 * logits);
  EXPECT_GT(added, 0.9 * logits);  // the buffer itself was measured
}

INSTANTIATE_TEST_SUITE_P(GemmRoutes, HeadLossMemory, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "onednn" : "blas"; });

}  // namespace
