// kernels/cpu_adam: every available kernel against torch::optim::AdamW and torch::optim::Adam
// element by element, bias correction off against a closed form, bf16 against fp32 and
// c10::BFloat16 rounding, thread-count invariance and per-group step counts.
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <c10/util/BFloat16.h>
#include <c10/util/string_utils.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "longtrain/core/check.h"
#include "longtrain/core/torch_compat.h"
#include "longtrain/kernels/cpu_adam.h"
#include "testing.h"

namespace {

using lt::kernels::Isa;
using lt::kernels::AdamParams;


std::vector<Isa> availableIsas() {
  std::vector<Isa> out;
  for (Isa isa : lt::kernels::kIsas)
    if (lt::kernels::isaSupported(isa)) out.push_back(isa);
  return out;
}

float* fp(const at::Tensor& t) { return t.data_ptr<float>(); }

double maxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// max |a - b| / max(1, |b|), element by element.
double maxStateErr(const at::Tensor& a, const at::Tensor& b) {
  auto bd = b.to(at::kDouble);
  return ((a.to(at::kDouble) - bd).abs() / bd.abs().clamp_min(1.0)).max().item<double>();
}

bool bitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

struct State {
  at::Tensor p, m, v;
};

// libtorch's optimizer (AdamW when a.adamw, else Adam with L2) from p0 over grads.
State torchRun(const AdamParams& a, const at::Tensor& p0, const std::vector<at::Tensor>& grads) {
  at::Tensor p = p0.clone().set_requires_grad(true);
  const auto betas = std::make_tuple(double{a.beta1}, double{a.beta2});
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (a.adamw) {
    opt = std::make_unique<torch::optim::AdamW>(
        std::vector<at::Tensor>{p},
        torch::optim::AdamWOptions(a.lr).betas(betas).eps(a.eps).weight_decay(a.weightDecay));
  } else {
    opt = std::make_unique<torch::optim::Adam>(
        std::vector<at::Tensor>{p},
        torch::optim::AdamOptions(a.lr).betas(betas).eps(a.eps).weight_decay(a.weightDecay));
  }
  for (const auto& g : grads) {
    p.mutable_grad() = g.clone();
    opt->step();
  }
  auto& st = *opt->state().at(lt::compat::optimizerStateKey(p));
  if (a.adamw) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(st);
    return {p.detach(), s.exp_avg(), s.exp_avg_sq()};
  }
  auto& s = static_cast<torch::optim::AdamParamState&>(st);
  return {p.detach(), s.exp_avg(), s.exp_avg_sq()};
}

State ourRun(Isa isa, const AdamParams& a, const at::Tensor& p0,
             const std::vector<at::Tensor>& grads, int threads = 1) {
  State s{p0.clone(), at::zeros_like(p0), at::zeros_like(p0)};
  for (size_t t = 0; t < grads.size(); ++t) {
    lt::kernels::adamStepWith(isa, fp(s.p), fp(grads[t]), fp(s.m), fp(s.v), s.p.numel(),
                              static_cast<int64_t>(t) + 1, a, threads);
  }
  return s;
}

std::vector<at::Tensor> randGrads(int64_t n, int steps) {
  std::vector<at::Tensor> g;
  for (int t = 0; t < steps; ++t) g.push_back(at::randn({n}));
  return g;
}

class CpuAdamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    at::manual_seed(1234);
  }
};

// The oracle test: 10 steps with weight decay, every size of DeepSpeed's test, every kernel.
void checkAgainstTorch(bool adamw) {
  AdamParams a;
  a.lr = 1e-3f;
  a.weightDecay = 0.1f;
  a.adamw = adamw;
  for (int64_t n : {22, 64, 128, 1024, 1048576}) {
    const at::Tensor p0 = at::randn({n});
    const auto grads = randGrads(n, 10);
    const State ref = torchRun(a, p0, grads);
    const State scalar = ourRun(Isa::Baseline, a, p0, grads);
    for (Isa isa : availableIsas()) {
      SCOPED_TRACE(::testing::Message() << lt::kernels::isaName(isa) << " n=" << n);
      const State ours = isa == Isa::Baseline ? scalar : ourRun(isa, a, p0, grads);
      EXPECT_LE(maxAbsDiff(ours.p, ref.p), lt::testing::Tol::kAdamParamAbs);
      EXPECT_LE(maxStateErr(ours.m, ref.m), lt::testing::Tol::kAdamStateRel);
      EXPECT_LE(maxStateErr(ours.v, ref.v), lt::testing::Tol::kAdamStateRel);
      EXPECT_LE(maxAbsDiff(ours.p, scalar.p), lt::testing::Tol::kAdamParamAbs);
      EXPECT_TRUE(ours.p.isfinite().all().item<bool>());
    }
  }
}

TEST_F(CpuAdamTest, MatchesTorchAdamW) { checkAgainstTorch(/*adamw=*/true); }

TEST_F(CpuAdamTest, MatchesTorchAdamWithL2) { checkAgainstTorch(/*adamw=*/false); }

TEST_F(CpuAdamTest, DispatchPicksASupportedKernel) {
  const Isa best = lt::kernels::isaBest();
  EXPECT_TRUE(lt::kernels::isaSupported(best));
  EXPECT_EQ(availableIsas().back(), best);
}

// Without bias correction and with a constant gradient g: m_t = (1 - b1^t) g and
// v_t = (1 - b2^t) g^2, and with d = 1 - lr*wd,
// p_T = d^T p_0 - lr sum_t d^(T-t) m_t / (sqrt(v_t) + eps).
TEST_F(CpuAdamTest, NoBiasCorrectionMatchesClosedForm) {
  AdamParams a;
  a.lr = 1e-3f;
  a.weightDecay = 0.1f;
  a.biasCorrection = false;
  const int64_t n = 1000;
  const int kSteps = 10;
  const at::Tensor p0 = at::rand({n}) * 2 - 1;
  const at::Tensor g = at::randn({n});
  const std::vector<at::Tensor> grads(kSteps, g);

  const double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, d = 1 - lr * a.weightDecay;
  auto gd = g.to(at::kDouble);
  auto p = p0.to(at::kDouble);
  at::Tensor m, v;
  for (int t = 1; t <= kSteps; ++t) {
    m = (1 - std::pow(b1, t)) * gd;
    v = (1 - std::pow(b2, t)) * gd * gd;
    p = d * p - lr * m / (v.sqrt() + eps);
  }
  for (Isa isa : availableIsas()) {
    SCOPED_TRACE(lt::kernels::isaName(isa));
    const State ours = ourRun(isa, a, p0, grads);
    EXPECT_LE(maxAbsDiff(ours.p, p), lt::testing::Tol::kAdamClosedForm);
    EXPECT_LE(maxStateErr(ours.m, m), lt::testing::Tol::kAdamStateRel);
    EXPECT_LE(maxStateErr(ours.v, v), lt::testing::Tol::kAdamStateRel);
  }
  // And bias correction on is a different trajectory (step 1 moves p by ~lr, not ~0.1 lr).
  AdamParams on = a;
  on.biasCorrection = true;
  EXPECT_GT(maxAbsDiff(ourRun(Isa::Baseline, on, p0, grads).p, p), 1e-4);
}

uint16_t bf16Bits(float f) { return c10::BFloat16(f).x; }

at::Tensor bf16Of(const at::Tensor& f) {  // c10's scalar rounding, as uint16 bits in int32
  std::vector<int32_t> bits(f.numel());
  for (int64_t i = 0; i < f.numel(); ++i) bits[i] = bf16Bits(f.data_ptr<float>()[i]);
  return at::tensor(bits);
}

at::Tensor asInt32(const std::vector<uint16_t>& b) {
  return at::tensor(std::vector<int32_t>(b.begin(), b.end()));
}

at::Tensor widen(const std::vector<uint16_t>& b) {
  at::Tensor t = at::empty({static_cast<int64_t>(b.size())});
  for (size_t i = 0; i < b.size(); ++i) {
    const uint32_t bits = static_cast<uint32_t>(b[i]) << 16;
    std::memcpy(fp(t) + i, &bits, sizeof bits);
  }
  return t;
}

// With a master copy, the fp32 master follows the fp32 kernel bit for bit and the bf16 copy
// is its round-to-nearest-even; that copy is within half a bf16 ulp (<= 2^-8 relative) of fp32.
TEST_F(CpuAdamTest, Bf16WithMasterEqualsFp32ThenRounding) {
  AdamParams a;
  a.weightDecay = 0.1f;
  const int64_t n = 1000 + 13;
  const at::Tensor p0 = at::randn({n});
  const auto grads = randGrads(n, 5);
  for (Isa isa : availableIsas()) {
    SCOPED_TRACE(lt::kernels::isaName(isa));
    const State ref = ourRun(isa, a, p0, grads);
    State s{p0.clone(), at::zeros_like(p0), at::zeros_like(p0)};
    std::vector<uint16_t> pb(n, 0);
    for (size_t t = 0; t < grads.size(); ++t)
      lt::kernels::adamStepBf16With(isa, pb.data(), fp(s.p), fp(grads[t]), fp(s.m), fp(s.v), n,
                                    static_cast<int64_t>(t) + 1, a, 1);
    EXPECT_TRUE(bitEqual(s.p, ref.p));
    EXPECT_TRUE(bitEqual(s.m, ref.m));
    EXPECT_TRUE(bitEqual(s.v, ref.v));
    EXPECT_TRUE(at::equal(asInt32(pb), bf16Of(ref.p)));
    const at::Tensor err = (widen(pb) - ref.p).abs();
    EXPECT_TRUE((err <= ref.p.abs() * std::ldexp(1.0, -8)).all().item<bool>());
  }
}

// Without a master copy, each step widens the bf16 value, takes the fp32 step and rounds back.
TEST_F(CpuAdamTest, Bf16WithoutMasterRoundsEveryStep) {
  AdamParams a;
  a.lr = 1e-2f;  // large enough that some updates survive bf16 rounding
  a.weightDecay = 0.1f;
  const int64_t n = 1000 + 13;
  const at::Tensor p0 = at::randn({n});
  const auto grads = randGrads(n, 5);
  for (Isa isa : availableIsas()) {
    SCOPED_TRACE(lt::kernels::isaName(isa));
    std::vector<uint16_t> pb(n);
    for (int64_t i = 0; i < n; ++i) pb[i] = bf16Bits(p0.data_ptr<float>()[i]);
    const std::vector<uint16_t> start = pb;
    at::Tensor m = at::zeros({n}), v = at::zeros({n}), mr = at::zeros({n}), vr = at::zeros({n});
    for (size_t t = 0; t < grads.size(); ++t) {
      at::Tensor pr = widen(pb);
      lt::kernels::adamStepWith(isa, fp(pr), fp(grads[t]), fp(mr), fp(vr), n,
                                static_cast<int64_t>(t) + 1, a, 1);
      lt::kernels::adamStepBf16With(isa, pb.data(), nullptr, fp(grads[t]), fp(m), fp(v), n,
                                    static_cast<int64_t>(t) + 1, a, 1);
      EXPECT_TRUE(at::equal(asInt32(pb), bf16Of(pr))) << "step " << t + 1;
    }
    EXPECT_TRUE(bitEqual(m, mr));
    EXPECT_TRUE(bitEqual(v, vr));
    EXPECT_NE(pb, start);
  }
}

// With lr = 0 the master is unchanged, so the bf16 output is the rounding of chosen values:
// ties to even both ways, just above a tie, overflow to inf, subnormals, signed zero, NaN.
TEST_F(CpuAdamTest, Bf16RoundingMatchesC10) {
  auto fromBits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  };
  const std::vector<float> special = {
      1.0f, fromBits(0x3F808000), fromBits(0x3F818000), fromBits(0x3F808001),
      fromBits(0xBF818000), -0.0f, 0.0f, std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
      -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
      -std::numeric_limits<float>::max(), 1e-40f, -3.14159f, 65504.0f, fromBits(0x7F7F7FFF)};
  AdamParams a;
  a.lr = 0;
  a.weightDecay = 0;
  const int64_t n = 37;  // a full vector or two plus a tail on every kernel
  for (Isa isa : availableIsas()) {
    SCOPED_TRACE(lt::kernels::isaName(isa));
    std::vector<float> master(n), g(n, 0), m(n, 0), v(n, 0);
    for (int64_t i = 0; i < n; ++i) master[i] = special[i % special.size()];
    const std::vector<float> before = master;
    std::vector<uint16_t> pb(n, 0);
    lt::kernels::adamStepBf16With(isa, pb.data(), master.data(), g.data(), m.data(), v.data(), n,
                                  1, a, 1);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(pb[i], bf16Bits(before[i])) << "value " << before[i] << " at " << i;
      if (!std::isnan(before[i])) {
        EXPECT_EQ(std::memcmp(&master[i], &before[i], 4), 0) << i;
      }
    }
  }
}

// Chunks are 64-aligned and every element takes the same path: any thread count gives the
// same bits. n is past 4 chunks of the per-thread minimum and not a multiple of 64.
TEST_F(CpuAdamTest, ThreadCountDoesNotChangeBits) {
  AdamParams a;
  a.weightDecay = 0.1f;
  const int64_t n = (1 << 20) + 37;
  const at::Tensor p0 = at::randn({n});
  const auto grads = randGrads(n, 2);
  for (Isa isa : availableIsas()) {
    SCOPED_TRACE(lt::kernels::isaName(isa));
    const State one = ourRun(isa, a, p0, grads, 1);
    for (int threads : {2, 3, 4}) {
      const State many = ourRun(isa, a, p0, grads, threads);
      EXPECT_TRUE(bitEqual(many.p, one.p)) << threads << " threads";
      EXPECT_TRUE(bitEqual(many.m, one.m)) << threads << " threads";
      EXPECT_TRUE(bitEqual(many.v, one.v)) << threads << " threads";
    }
    std::vector<uint16_t> b1(n), b3(n);
    at::Tensor m1 = at::zeros({n}), v1 = at::zeros({n}), m3 = at::zeros({n}), v3 = at::zeros({n});
    at::Tensor q1 = p0.clone(), q3 = p0.clone();
    lt::kernels::adamStepBf16With(isa, b1.data(), fp(q1), fp(grads[0]), fp(m1), fp(v1), n, 1, a, 1);
    lt::kernels::adamStepBf16With(isa, b3.data(), fp(q3), fp(grads[0]), fp(m3), fp(v3), n, 1, a, 3);
    EXPECT_EQ(b1, b3);
    EXPECT_TRUE(bitEqual(q1, q3));
  }
}

// Each sub-group keeps its own m, v and step count: interleaving groups gives each the
// result of stepping it alone.
TEST_F(CpuAdamTest, GroupsKeepOwnStateAndStepCount) {
  AdamParams a;
  a.weightDecay = 0.1f;
  lt::kernels::CpuAdam opt(a, 2);
  const int g0 = opt.addGroup(1000), g1 = opt.addGroup(333);
  EXPECT_EQ(g0, 0);
  EXPECT_EQ(g1, 1);
  EXPECT_EQ(opt.groupCount(), 2);
  EXPECT_EQ(opt.groupNumel(g1), 333);
  EXPECT_EQ(opt.stepCount(g0), 0);
  const at::Tensor p0 = at::randn({1000}), q0 = at::randn({333});
  const auto grads0 = randGrads(1000, 3);
  const auto grads1 = randGrads(333, 1);

  at::Tensor p = p0.clone(), q = q0.clone();
  opt.step(g0, fp(p), fp(grads0[0]));
  opt.step(g1, fp(q), fp(grads1[0]));
  opt.step(g0, fp(p), fp(grads0[1]));
  opt.step(g0, fp(p), fp(grads0[2]));
  EXPECT_EQ(opt.stepCount(g0), 3);
  EXPECT_EQ(opt.stepCount(g1), 1);

  const Isa best = lt::kernels::isaBest();
  const State ref0 = ourRun(best, a, p0, grads0);
  const State ref1 = ourRun(best, a, q0, grads1);
  EXPECT_TRUE(bitEqual(p, ref0.p));
  EXPECT_TRUE(bitEqual(at::from_blob(opt.expAvg(g0), {1000}), ref0.m));
  EXPECT_TRUE(bitEqual(at::from_blob(opt.expAvgSq(g0), {1000}), ref0.v));
  EXPECT_TRUE(bitEqual(q, ref1.p));
  EXPECT_TRUE(bitEqual(at::from_blob(opt.expAvg(g1), {333}), ref1.m));
  EXPECT_TRUE(bitEqual(at::from_blob(opt.expAvgSq(g1), {333}), ref1.v));

  // setLr applies from the next step; setStepCount rewinds the bias correction.
  opt.setLr(5e-4f);
  opt.setStepCount(g1, 0);
  at::Tensor m = at::zeros({333}), v = at::zeros({333}), r = q.clone();
  std::memcpy(fp(m), opt.expAvg(g1), 333 * sizeof(float));
  std::memcpy(fp(v), opt.expAvgSq(g1), 333 * sizeof(float));
  AdamParams half = a;
  half.lr = 5e-4f;
  lt::kernels::adamStep(fp(r), fp(grads1[0]), fp(m), fp(v), 333, 1, half, 1);
  opt.step(g1, fp(q), fp(grads1[0]));
  EXPECT_EQ(opt.stepCount(g1), 1);
  EXPECT_TRUE(bitEqual(q, r));
}

TEST_F(CpuAdamTest, RejectsBadInput) {
  AdamParams a;
  lt::kernels::CpuAdam opt(a, 1);
  const int g = opt.addGroup(8);
  std::vector<float> p(8, 1), grad(8, 1), m(8, 0), v(8, 0);
  EXPECT_THROW(opt.step(1, p.data(), grad.data()), lt::Error);
  EXPECT_THROW(opt.step(g, nullptr, grad.data()), lt::Error);
  EXPECT_EQ(opt.stepCount(g), 0);  // a rejected step does not count
  EXPECT_THROW(opt.addGroup(0), lt::Error);
  EXPECT_THROW(opt.setLr(-1), lt::Error);
  EXPECT_THROW(lt::kernels::adamStep(p.data(), grad.data(), m.data(), v.data(), 8, 0, a, 1),
               lt::Error);
  AdamParams bad = a;
  bad.beta1 = 1.0f;
  EXPECT_THROW(lt::kernels::CpuAdam(bad, 1), lt::Error);
  bad = a;
  bad.eps = 0;
  EXPECT_THROW(lt::kernels::adamStep(p.data(), grad.data(), m.data(), v.data(), 8, 1, bad, 1),
               lt::Error);
  for (Isa isa : {Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16}) {
    if (!lt::kernels::isaSupported(isa)) {
      EXPECT_THROW(lt::kernels::adamStepWith(isa, p.data(), grad.data(), m.data(), v.data(), 8,
                                             1, a, 1),
                   lt::Error);
    }
  }
}

}  // namespace

namespace {

// A speculative step writes shadows and leaves the state alone; committing it gives exactly
// the in-place step; not committing is an exact rollback.
TEST_F(CpuAdamTest, SpeculativeStepCommitsBitIdenticallyAndRollsBackExactly) {
  const int64_t n = 1000;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto p0 = at::randn({n}, gen), g = at::randn({n}, gen);
  lt::kernels::AdamParams ap;
  lt::kernels::CpuAdam a(ap, 1), b(ap, 1);
  a.addGroup(n);
  b.addGroup(n);
  auto pa = p0.clone(), pb = p0.clone(), out = at::empty({n});
  for (int s = 0; s < 3; ++s) {
    a.step(0, pa.data_ptr<float>(), g.data_ptr<float>());
    b.stepSpeculative(0, pb.data_ptr<float>(), g.data_ptr<float>(), out.data_ptr<float>());
    if (s == 1) {  // roll back this one: nothing changed
      EXPECT_EQ(b.stepCount(0), 1);
      b.stepSpeculative(0, pb.data_ptr<float>(), g.data_ptr<float>(), out.data_ptr<float>());
    }
    b.commitSpeculative(0);
    pb.copy_(out);
    EXPECT_TRUE(at::equal(pa, pb)) << "step " << s;
    EXPECT_EQ(std::memcmp(a.expAvg(0), b.expAvg(0), n * 4), 0);
    EXPECT_EQ(std::memcmp(a.expAvgSq(0), b.expAvgSq(0), n * 4), 0);
    EXPECT_EQ(a.stepCount(0), b.stepCount(0));
  }
}

}  // namespace
