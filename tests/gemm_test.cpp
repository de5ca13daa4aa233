// The GEMM routes (model/gemm.h): oneDNN's sgemm under autograd against ATen's at::linear, its
// numerics against a double-precision loop, and a whole training run on each route.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "longtrain/config/parse.h"
#include "longtrain/model/gemm.h"
#include "longtrain/train/machine.h"
#include "testing.h"

namespace {

using lt::testing::relErr;
using lt::testing::Tol;

TEST(OneDnnGemm, ComputesRightAgainstADoubleLoop) {
  EXPECT_LE(lt::train::gemmRelativeError(lt::model::GemmRoute::OneDnn), Tol::kBlasKernel);
}

// Forward and both gradients equal at::linear's at odd shapes, with leading dims, a
// non-contiguous input, and an input that needs no gradient.
TEST(OneDnnGemm, LinearEqualsATenForwardAndBackward) {
  struct Case {
    std::vector<int64_t> x;
    int64_t n;
    bool transposed;
  };
  const std::vector<Case> cases = {{{1, 1}, 1, false},    {{7, 13}, 5, false},    {{2, 7, 13}, 5, false},
                                   {{3, 33, 64}, 129, false}, {{2, 65, 256}, 704, false}, {{2, 31, 48}, 17, true}};
  at::manual_seed(7);
  for (const auto& c : cases) {
    auto x = at::randn(c.x);
    if (c.transposed) x = at::randn({c.x[0], c.x[2], c.x[1]}).transpose(1, 2);  // same shape, strided
    const auto w = at::randn({c.n, c.x.back()});
    const auto dy = at::randn([&] { auto s = c.x; s.back() = c.n; return s; }());
    auto grads = [&](bool oneDnn, bool inputGrad) {
      auto xi = x.detach().requires_grad_(inputGrad), wi = w.detach().requires_grad_(true);
      auto y = oneDnn ? lt::model::oneDnnLinear(xi, wi) : at::linear(xi, wi);
      y.backward(dy);
      return std::vector<at::Tensor>{y.detach(), inputGrad ? xi.grad() : at::Tensor(), wi.grad()};
    };
    for (bool inputGrad : {true, false}) {
      const auto got = grads(true, inputGrad), want = grads(false, inputGrad);
      const std::string what = "x " + std::to_string(c.x.size()) + "-d, last " + std::to_string(c.x.back()) +
                               ", n " + std::to_string(c.n) + (inputGrad ? "" : ", no dx");
      EXPECT_LE(relErr(got[0], want[0]), Tol::kFusedKernel) << what;
      if (inputGrad) EXPECT_LE(relErr(got[1], want[1]), Tol::kFusedKernel) << what;
      else EXPECT_FALSE(got[1].defined()) << what;
      EXPECT_LE(relErr(got[2], want[2]), Tol::kFusedKernel) << what;
    }
  }
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
