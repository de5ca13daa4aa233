// The GEMM routes (kernels/gemm.h): oneDNN's sgemm under autograd against ATen's at::linear, its
// numerics against a double-precision loop, and a whole training run on each route; the bf16
// route against fp32 products of the same bf16-rounded operands, and its rounding against c10's.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "longtrain/config/parse.h"
#include "longtrain/kernels/fused_ops.h"
#include "longtrain/kernels/gemm.h"
#include "longtrain/train/machine.h"
#include "testing.h"

namespace {

using lt::testing::relErr;
using lt::testing::Tol;

TEST(OneDnnGemm, ComputesRightAgainstADoubleLoop) {
  EXPECT_LE(lt::train::gemmRelativeError(lt::kernels::GemmRoute::OneDnn), Tol::kBlasKernel);
}

struct LinearCase {
  std::vector<int64_t> x;
  int64_t n;
  bool transposed;
};
// Odd shapes, leading dims, a non-contiguous input, and (last) a weight gradient over 4096
// tokens, more than one of OpenBLAS's blocks of k.
const std::vector<LinearCase> kLinearCases = {{{1, 1}, 1, false},          {{7, 13}, 5, false},
                                              {{2, 7, 13}, 5, false},      {{3, 33, 64}, 129, false},
                                              {{2, 65, 256}, 704, false},  {{2, 31, 48}, 17, true},
                                              {{4, 1024, 64}, 384, false}};

// y, dx (undefined without inputGrad) and dw of `linear` at case c, seeded the same every call.
template <class Linear>
std::vector<at::Tensor> linearGrads(const LinearCase& c, bool inputGrad, const Linear& linear) {
  at::manual_seed(7);
  auto x = at::randn(c.x);
  if (c.transposed) x = at::randn({c.x[0], c.x[2], c.x[1]}).transpose(1, 2);  // same shape, strided
  const auto w = at::randn({c.n, c.x.back()});
  auto ySizes = c.x;
  ySizes.back() = c.n;
  const auto dy = at::randn(ySizes);
  auto xi = x.detach().requires_grad_(inputGrad), wi = w.detach().requires_grad_(true);
  auto y = linear(xi, wi);
  y.backward(dy);
  return {y.detach(), inputGrad ? xi.grad() : at::Tensor(), wi.grad()};
}

std::string describe(const LinearCase& c, bool inputGrad) {
  return "x " + std::to_string(c.x.size()) + "-d, last " + std::to_string(c.x.back()) + ", n " + std::to_string(c.n) +
         (inputGrad ? "" : ", no dx");
}

at::Tensor atenLinear(const at::Tensor& x, const at::Tensor& w) { return at::linear(x, w); }

// Forward and both gradients equal at::linear's.
TEST(OneDnnGemm, LinearEqualsATenForwardAndBackward) {
  for (const auto& c : kLinearCases) {
    for (bool inputGrad : {true, false}) {
      const auto got = linearGrads(c, inputGrad, [](const at::Tensor& x, const at::Tensor& w) {
        return lt::kernels::linear(x, w, lt::kernels::GemmRoute::OneDnn);
      });
      const auto want = linearGrads(c, inputGrad, atenLinear);
      EXPECT_LE(relErr(got[0], want[0]), Tol::kFusedKernel) << describe(c, inputGrad);
      if (inputGrad) EXPECT_LE(relErr(got[1], want[1]), Tol::kFusedKernel) << describe(c, inputGrad);
      else EXPECT_FALSE(got[1].defined()) << describe(c, inputGrad);
      EXPECT_LE(relErr(got[2], want[2]), Tol::kFusedKernel) << describe(c, inputGrad);
    }
  }
}

// The BLAS route (a zeroed output and beta = 1) gives at::linear's bits, forward and backward,
// against at::linear of a contiguous x (a strided 3-d x takes ATen's bmm, another summation).
TEST(BlasGemm, LinearEqualsATenBitwise) {
  for (const auto& c : kLinearCases) {
    for (bool inputGrad : {true, false}) {
      const auto got = linearGrads(c, inputGrad, [](const at::Tensor& x, const at::Tensor& w) {
        return lt::kernels::linear(x, w, lt::kernels::GemmRoute::Blas);
      });
      const auto want = linearGrads(c, inputGrad, [](const at::Tensor& x, const at::Tensor& w) {
        return at::linear(x.contiguous(), w);
      });
      EXPECT_TRUE(at::equal(got[0], want[0])) << describe(c, inputGrad);
      if (inputGrad) EXPECT_TRUE(at::equal(got[1], want[1])) << describe(c, inputGrad);
      else EXPECT_FALSE(got[1].defined()) << describe(c, inputGrad);
      EXPECT_TRUE(at::equal(got[2], want[2])) << describe(c, inputGrad);
    }
  }
}

// The LM head's products (matmulInto, transposes as flags) on the BLAS route: at::mm's bits.
// Past 4096 rows of a result the BLAS route runs one GEMM per 4096 rows (gemm.cpp:
// kBlasRowBlock): every block of y and dx is ATen's product of those rows alone, bit for bit;
// the weight gradient (rows: the 48 outputs) is at::linear's; the whole within the kernel
// tolerance of one call. matmulAccumulate adds its blocks to what out held. On one thread: on
// two, this test process's first OpenBLAS calls split a product differently from later ones
// (the bits of a fresh process's block and of the same product moments later differed here).
TEST(BlasGemm, ProductsRunInBlocksOf4096Rows) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  at::manual_seed(12);
  const int64_t rows = 2 * 4100, n = 48;
  const auto x = at::randn({2, 4100, 64}), w = at::randn({n, 64}), dy = at::randn({2, 4100, n});
  auto run = [&](bool ours) {
    auto xi = x.detach().requires_grad_(true), wi = w.detach().requires_grad_(true);
    auto y = ours ? lt::kernels::linear(xi, wi, lt::kernels::GemmRoute::Blas) : at::linear(xi, wi);
    y.backward(dy);
    return std::vector<at::Tensor>{y.detach().reshape({rows, n}), xi.grad().reshape({rows, -1}), wi.grad()};
  };
  const auto got = run(true), whole = run(false);
  EXPECT_TRUE(at::equal(got[2], whole[2])) << "the weight gradient";
  for (int64_t s = 0; s < rows; s += 4096) {
    const int64_t len = std::min<int64_t>(4096, rows - s);
    const auto xs = x.reshape({rows, -1}).narrow(0, s, len), dys = dy.reshape({rows, n}).narrow(0, s, len);
    EXPECT_TRUE(at::equal(got[0].narrow(0, s, len), at::mm(xs, w.t()))) << "y rows from " << s;
    EXPECT_TRUE(at::equal(got[1].narrow(0, s, len), at::mm(dys, w))) << "dx rows from " << s;
  }
  EXPECT_LE(relErr(got[0], whole[0]), Tol::kFusedKernel);
  EXPECT_LE(relErr(got[1], whole[1]), Tol::kFusedKernel);

  const auto a = at::randn({96, 9000}), b = at::randn({96, 40});  // out [9000, 40] = a^T b
  const auto want = at::mm(a.t().to(at::kDouble), b.to(at::kDouble)).to(at::kFloat);
  auto acc = at::ones({9000, 40});
  lt::kernels::matmulAccumulate(acc, a, true, b, false, lt::kernels::GemmRoute::Blas);
  EXPECT_LE(relErr(acc, want + 1), Tol::kFusedKernel);
  EXPECT_LE(relErr(lt::kernels::matmul(a, true, b, false, lt::kernels::GemmRoute::Blas), want), Tol::kFusedKernel);
  at::set_num_threads(threads);
}

TEST(BlasGemm, MatmulIntoEqualsMmBitwise) {
  at::manual_seed(11);
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {33, 17, 5}, {4096, 128, 64},
                                                                           {64, 128, 4096}}) {
    for (bool transA : {false, true})
      for (bool transB : {false, true}) {
        const auto a = transA ? at::randn({k, m}) : at::randn({m, k}), b = transB ? at::randn({n, k}) : at::randn({k, n});
        const auto got = lt::kernels::matmul(a, transA, b, transB, lt::kernels::GemmRoute::Blas);
        EXPECT_TRUE(at::equal(got, at::mm(transA ? a.t() : a, transB ? b.t() : b)))
            << m << "x" << n << "x" << k << " transA " << transA << " transB " << transB;
      }
  }
}

// Every build of the conversion rounds as c10::BFloat16 does, bit for bit: halfway cases both
// ways, subnormals, infinities, NaN, the largest floats, and an odd length (the vector tail).
TEST(Bf16Gemm, ConversionRoundsAsC10) {
  at::manual_seed(3);
  auto x = at::cat({at::randn({1001}) * 1e3, at::randn({64}) * 1e-39,
                    at::tensor({0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 3.4028235e38f, -3.4028235e38f,
                                std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(), 1.00390625f, 1.01171875f})});
  const float* xp = x.data_ptr<float>();
  for (auto isa : {lt::kernels::Isa::Baseline, lt::kernels::Isa::Avx2, lt::kernels::Isa::Avx512}) {
    if (!lt::kernels::isaSupported(isa)) continue;
    const auto got = lt::kernels::toBf16(x, isa);
    ASSERT_EQ(got.scalar_type(), at::kBFloat16);
    const auto* g = reinterpret_cast<const uint16_t*>(got.data_ptr<at::BFloat16>());
    int64_t wrong = 0;  // c10's scalar rounding (ATen's vectorized .to() writes NaN as 0xFFFF)
    for (int64_t i = 0; i < x.numel(); ++i) wrong += g[i] != c10::BFloat16(xp[i]).x;
    EXPECT_EQ(wrong, 0) << lt::kernels::isaName(isa);
  }
}

// In place (the LM head's logits gradient): the same bits as the copying conversion, at lengths
// inside the serial first part, at its edge, and across several parallel waves with a tail.
TEST(Bf16Gemm, InPlaceConversionEqualsTheCopy) {
  at::manual_seed(5);
  for (int64_t n : {int64_t{100}, int64_t{16384}, int64_t{16385}, int64_t{200003}}) {
    const auto x = at::randn({n}) * 100;
    const auto want = lt::kernels::toBf16(x);
    auto buffer = x.clone();
    const auto got = lt::kernels::toBf16InPlace(buffer);
    ASSERT_EQ(got.sizes(), x.sizes());
    EXPECT_EQ(got.data_ptr(), buffer.data_ptr()) << n;  // no copy
    EXPECT_TRUE(at::equal(got.view(at::kShort), want.view(at::kShort))) << n;
  }
}

// The bf16 route computes exactly what it claims: the product of the bf16-rounded operands,
// accumulated in fp32, returned in fp32 (never rounded to bf16). The reference forms those
// products in fp32 with ATen; forward and both gradients, odd shapes, leading dims; on oneDNN's
// kernel and on the widened fallback that CPUs without one run.
TEST(Bf16Gemm, LinearIsFp32MathOnBf16RoundedOperands) {
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
      {{1, 1}, 1}, {{7, 13}, 5}, {{2, 7, 13}, 5}, {{3, 33, 64}, 129}, {{2, 65, 256}, 704}};
  at::manual_seed(11);
  auto rounded = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
  for (bool widened : {false, true})
  for (const auto& [xs, n] : cases) {
    lt::kernels::forceWidenedBf16ForTesting(widened);
    const auto x = at::randn(xs), w = at::randn({n, xs.back()});
    auto ys = xs;
    ys.back() = n;
    const auto dy = at::randn(ys);
    auto xi = x.detach().requires_grad_(true), wi = w.detach().requires_grad_(true);
    auto y = lt::kernels::linear(xi, wi, lt::kernels::GemmRoute::Bf16);
    y.backward(dy);
    const auto x2 = rounded(x).reshape({-1, xs.back()}), dy2 = rounded(dy).reshape({-1, n});
    const std::string what = std::to_string(xs.size()) + "-d x, last " + std::to_string(xs.back()) + ", n " +
                             std::to_string(n) + (widened ? ", widened" : "");
    ASSERT_EQ(y.scalar_type(), at::kFloat) << what;
    EXPECT_LE(relErr(y, at::linear(rounded(x), rounded(w))), Tol::kFusedKernel) << what;
    EXPECT_LE(relErr(xi.grad(), at::mm(dy2, rounded(w)).view(xs)), Tol::kFusedKernel) << what;
    EXPECT_LE(relErr(wi.grad(), at::mm(dy2.t(), x2)), Tol::kFusedKernel) << what;
  }
  lt::kernels::forceWidenedBf16ForTesting(false);
  // Not fp32 in disguise: against the unrounded operands the difference is bf16's, not fp32's.
  const auto x = at::randn({64, 96}), w = at::randn({32, 96});
  EXPECT_GT(relErr(lt::kernels::linear(x, w, lt::kernels::GemmRoute::Bf16), at::linear(x, w)), 1e-4);
}

// matmulAccumulate on the bf16 route adds the product of the rounded operands to what out held
// (oneDNN's sum post-op; the widened fallback's BLAS with beta = 1), for each transpose form.
TEST(Bf16Gemm, AccumulateAddsTheRoundedProduct) {
  at::manual_seed(13);
  auto rounded = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat).to(at::kDouble); };
  for (bool widened : {false, true})
    for (bool transA : {false, true})
      for (bool transB : {false, true}) {
        lt::kernels::forceWidenedBf16ForTesting(widened);
        const int64_t m = 37, n = 70, k = 129;
        const auto a = transA ? at::randn({k, m}) : at::randn({m, k}), b = transB ? at::randn({n, k}) : at::randn({k, n});
        const auto held = at::randn({m, n});
        auto out = held.clone();
        lt::kernels::matmulAccumulate(out, a, transA, b, transB, lt::kernels::GemmRoute::Bf16);
        const auto ra = rounded(a), rb = rounded(b);
        const auto want = held.to(at::kDouble) + at::mm(transA ? ra.t() : ra, transB ? rb.t() : rb);
        EXPECT_LE(relErr(out, want.to(at::kFloat)), Tol::kFusedKernel)
            << "transA " << transA << " transB " << transB << (widened ? ", widened" : "");
      }
  lt::kernels::forceWidenedBf16ForTesting(false);
}

// The whole model on each route: losses within the data-parallel tolerance of each other over
// 5 steps (the same math, another summation order), and each route bit-identical run to run.
TEST(OneDnnGemm, TrainingOnEitherRouteAgreesAndRepeatsExactly) {
  auto j = lt::testing::tinyTrainConfig();
  std::vector<std::vector<double>> runs;
  for (const char* route : {"blas", "onednn", "onednn"}) {
    j["model"]["gemm"] = route;
    runs.push_back(lt::testing::trainOnRanks(j, 1, 1, 5)[0].losses);
  }
  for (size_t s = 0; s < runs[0].size(); ++s) {
    EXPECT_NEAR(runs[1][s], runs[0][s], Tol::kDataParallel * std::abs(runs[0][s])) << "step " << s + 1;
    EXPECT_EQ(runs[2][s], runs[1][s]) << "step " << s + 1;
  }
}

}  // namespace
