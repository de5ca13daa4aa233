// bench/ring_attention: one attention call (forward + backward) under SP on thread ranks for
// Ulysses (all-to-all), ring (K/V passed point to point) and the hybrid, contiguous and zigzag: step time
// (slowest rank), bytes each rank receives (counted from the shapes the code sends), and the
// ring kernel's per-rank tile time max/min (zigzag's balance). It also checks the result
// against one rank's fused attention on the whole sequence.
// Non-obvious: ranks are threads with 1 intra-op thread each, so P ranks use min(P, cores)
// cores; at P = 4 on 2 cores they oversubscribe (the step time then includes time-slicing).
// Usage: bench_ring_attention [seq=8192] [heads=4] [kv_heads=2] [head_dim=64] [iters=2] [tile=0: the kernel's]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "longtrain/comm/comm.h"
#include "longtrain/core/check.h"
#include "longtrain/kernels/fused_attention.h"
#include "longtrain/sp/layout.h"
#include "longtrain/sp/ring_attention.h"

namespace {

struct Shape {
  int64_t S, H, KV, D;
};

struct Mode {
  int P, R;
  const char* balance;
};

// Bytes one rank receives in one forward + backward (fp32): Ulysses moves (U-1)/U of q, k, v
// (kv heads replicated up to U) and the output each way; the ring receives R-1 K/V shards in
// forward, again in backward, and R-1 dK/dV partial sums.
double bytesPerRank(const Shape& s, const lt::config::ParallelLayout& l) {
  const double n = static_cast<double>(s.S) / l.P, U = l.U, R = l.R;
  const double kvHeads = std::max<double>(static_cast<double>(s.KV), U);  // replicated to U when fewer
  double b = 0;
  if (l.U > 1) b += 2 * (U - 1) / U * n * (2 * s.H + 2 * kvHeads) * s.D * 4;
  const double kvShard = U * n * std::max<double>(kvHeads / U, 1) * s.D * 4;  // one ring rank's k (or v)
  if (l.R > 1) b += 6 * (R - 1) * kvShard;
  return b;
}

// Causal (query, key) pairs the ranks' queries see, max / min over ranks: the work zigzag
// balances, free of timing noise. Under Ulysses a rank's queries are its Ulysses group's.
double pairImbalance(const Shape& s, const lt::config::ParallelLayout& l) {
  std::vector<double> pairs(l.R, 0);
  for (int r = 0; r < l.P; ++r) pairs[l.ringRankOf(r)] += (lt::sp::tokenIndex(l, r, s.S / l.P) + 1).sum().item<double>();
  return *std::max_element(pairs.begin(), pairs.end()) / *std::min_element(pairs.begin(), pairs.end());
}

struct Result {
  double stepS = 0, computeMax = 0, computeMin = 0, maxErr = 0;
};

Result run(const Shape& s, const lt::config::ParallelLayout& l, int iters, int64_t chunk, const at::Tensor& q, const at::Tensor& k,
           const at::Tensor& v, const at::Tensor& dO, const at::Tensor& refOut) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> step(l.P, 0), compute(l.P, 0), err(l.P, 0);
  std::vector<std::thread> ts;
  for (int r = 0; r < l.P; ++r)
    ts.emplace_back([&, r] {
      at::set_num_threads(1);
      lt::comm::Options o;
      o.timeout = std::chrono::milliseconds(600000);
      auto g = lt::comm::makeGroups(store, r, l.P, l.P, o, {}, l.R);
      double seconds = 0;
      auto core = [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const at::Tensor&) {
        return lt::kernels::fusedAttention(a, b, c);
      };
      auto attn = lt::sp::sequenceParallelAttention(g.spUlysses, g.spRing, l, r, core, chunk, &seconds);
      auto idx = lt::sp::tokenIndex(l, r, s.S / l.P);
      auto mine = [&](const at::Tensor& t) { return t.index_select(1, idx).contiguous().requires_grad_(true); };
      auto qi = mine(q), ki = mine(k), vi = mine(v);
      auto gi = dO.index_select(1, idx).contiguous();
      for (int it = 0; it <= iters; ++it) {  // iteration 0 warms up
        if (it == 1) seconds = 0;
        g.sp->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        auto out = attn(qi, ki, vi, at::Tensor());
        torch::autograd::backward({out}, {gi});
        if (it > 0) step[r] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
        if (it == iters) err[r] = (out.detach() - refOut.index_select(1, idx)).abs().max().item<double>();
        qi.mutable_grad() = at::Tensor(), ki.mutable_grad() = at::Tensor(), vi.mutable_grad() = at::Tensor();
      }
      compute[r] = seconds / iters;
      g.world->barrier();
    });
  for (auto& t : ts) t.join();
  Result res;
  res.stepS = *std::max_element(step.begin(), step.end());
  res.computeMax = *std::max_element(compute.begin(), compute.end());
  res.computeMin = *std::min_element(compute.begin(), compute.end());
  res.maxErr = *std::max_element(err.begin(), err.end());
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t def) { return argc > i ? std::atoll(argv[i]) : def; };
  const Shape s{arg(1, 8192), arg(2, 4), arg(3, 2), arg(4, 64)};
  const int iters = static_cast<int>(arg(5, 2));
  const int64_t chunk = arg(6, 0);
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf("ring attention bench: seq %lld, %lld heads, %lld kv heads, head dim %lld, batch 1, fp32, %u cores "
              "(P = 4 oversubscribes %u cores), %d timed iterations, ring tile %lld (0: the fused kernel's)\n",
              (long long)s.S, (long long)s.H, (long long)s.KV, (long long)s.D, cores, cores, iters, (long long)chunk);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  auto q = at::randn({1, s.S, s.H, s.D}, gen), k = at::randn({1, s.S, s.KV, s.D}, gen),
       v = at::randn({1, s.S, s.KV, s.D}, gen), dO = at::randn({1, s.S, s.H, s.D}, gen);
  at::Tensor ref;
  {
    at::NoGradGuard ng;
    ref = lt::kernels::fusedAttention(q, k, v);
  }
  std::printf("| P | layout | MiB received/rank | step s (fwd+bwd) | ring tile s max/min per rank | causal pairs max/min | max abs err |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  const std::vector<Mode> modes = {{2, 1, "contiguous"}, {2, 2, "contiguous"}, {2, 2, "zigzag"},
                                   {4, 1, "contiguous"}, {4, 2, "zigzag"},     {4, 4, "contiguous"},
                                   {4, 4, "zigzag"}};
  for (const auto& m : modes) {
    lt::config::ParallelLayout l;
    try {
      l = lt::config::ParallelLayout::make(m.P, m.P, s.H, s.KV, m.R, *lt::config::optionFromName<lt::config::SpBalance>(m.balance));
    } catch (const lt::Error& e) {
      std::printf("| %d | R=%d %s | skipped: %s |\n", m.P, m.R, m.balance, e.what());
      continue;
    }
    const Result r = run(s, l, iters, chunk, q, k, v, dO, ref);
    char balance[64] = "n/a (fused core)";
    if (!l.ulyssesOnly())
      std::snprintf(balance, sizeof balance, "%.2f / %.2f = %.2fx", r.computeMax, r.computeMin,
                    r.computeMax / r.computeMin);
    std::printf("| %d | %s | %.1f | %.2f | %s | %.2fx | %.1e |\n", l.P, l.describe().c_str(),
                bytesPerRank(s, l) / 1048576.0, r.stepS, balance, l.ulyssesOnly() ? 1.0 : pairImbalance(s, l), r.maxErr);
    std::fflush(stdout);
    LT_CHECK(r.maxErr < 1e-4, "result differs from one rank by ", r.maxErr);
  }
  return 0;
}
