// GEMM peak and BLAS check (machine.h). The check's reference is a plain loop in double, not
// dgemm: dgemm comes from the same library whose kernel is under test.
#include "longtrain/train/machine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "longtrain/core/check.h"
#include "longtrain/kernels/fused_attention.h"

namespace lt::train {

double modelFlopsPerToken(const model::ModelConfig& m, int64_t seqLen) {
  const double table = static_cast<double>(m.vocabSize) * static_cast<double>(m.hidden);
  // numParams counts the table once, and an untied head separately; a tied head reuses the table.
  const double matmulParams = static_cast<double>(m.numParams()) - table + (m.tieEmbeddings ? table : 0);
  // Causal attention averages S / 2 keys per query, hence 6 L S qDim; a window W < S averages
  // W - W^2 / 2S, so the same form with 2W - W^2 / S for S.
  const double S = static_cast<double>(seqLen), W = static_cast<double>(m.slidingWindow);
  const double context = m.slidingWindow > 0 && W < S ? 2 * W - W * W / S : S;
  return 6 * matmulParams + 6 * static_cast<double>(m.layers) * context * static_cast<double>(m.qDim());
}

double measureGemmPeakFlops(kernels::GemmRoute route) {
  constexpr int64_t n = 1024;
  // bf16 operands are converted once, here: the rate is the GEMM's alone, as for fp32.
  const auto type = route == kernels::GemmRoute::Bf16 ? at::kBFloat16 : at::kFloat;
  auto a = at::randn({n, n}).to(type), b = at::randn({n, n}).to(type), c = at::empty({n, n});
  auto mm = [&] { kernels::matmulInto(c, a, false, b, false, route); };
  mm();  // warm-up: thread pool, page faults, packing buffers
  double best = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    mm();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s);
    if (i >= 2 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(300)) break;
  }
  return best;
}

double measureAttentionSeconds(int64_t heads, int64_t kvHeads, int64_t headDim, int64_t seq, int64_t tile, bool bf16) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const auto q = at::randn({1, seq, heads, headDim}, gen), dout = at::randn({1, seq, heads, headDim}, gen);
  const auto k = at::randn({1, seq, kvHeads, headDim}, gen), v = at::randn({1, seq, kvHeads, headDim}, gen);
  kernels::FusedAttentionOptions o;
  o.tile = tile;
  o.bf16 = bf16;
  auto run = [&] { kernels::fusedAttentionBackward(q, k, v, kernels::fusedAttentionForward(q, k, v, o), dout, o); };
  run();  // warm-up: scratch, page faults
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// On an Intel Xeon (family 6, model 167) vdpbf16ps multiplied no faster than fp32's FMAs and
// the bf16 build lost (bench/attention, seq 4096 x head dim 16: 120 against 110 ms), on an AMD
// EPYC Zen 5 it was 16-35% faster, and on the Xeon's AMX tiles 1.4-2.5x: so it is measured.
Bf16AttentionChoice measureBf16Attention(const model::ModelConfig& m, int64_t seqLen) {
  Bf16AttentionChoice c;
  c.tokens = std::min<int64_t>(seqLen, 1024);
  if (!kernels::fusedAttentionBf16Supported()) return c;
  const int64_t kv = std::min<int64_t>(m.kvHeads, 2), group = m.heads / m.kvHeads;
  c.fp32Seconds = measureAttentionSeconds(kv * group, kv, m.headDim(), c.tokens, m.attentionChunk, false);
  c.bf16Seconds = measureAttentionSeconds(kv * group, kv, m.headDim(), c.tokens, m.attentionChunk, true);
  c.faster = c.fp32Seconds > kBf16FasterBy * c.bf16Seconds;
  return c;
}

bool bf16AttentionAskedFor(const config::Config& cfg, bool bf16Gemms) {
  return bf16Gemms && cfg.precision.attention && cfg.model.attention == config::AttentionKernel::Fused;
}

bool bf16AttentionWinsHere(const config::Config& cfg, Bf16AttentionChoice* measured) {
  if (!kernels::fusedAttentionBf16Supported()) return false;
  if (!cfg.precision.onlyIfFaster) return true;
  const Bf16AttentionChoice c = measureBf16Attention(cfg.model, cfg.data.seqLen);
  if (measured) *measured = c;
  return c.faster;
}

double gemmRelativeError(kernels::GemmRoute route) {
  LT_ASSERT(route != kernels::GemmRoute::Bf16, "gemmRelativeError checks fp32 routes");
  double worst = 0;
  const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {65, 33, 129}, {200, 177, 131}, {1, 300, 257}};
  for (const auto& s : shapes) {
    const int64_t M = s[0], K = s[1], N = s[2];
    auto a = at::randn({M, K}), b = at::randn({K, N});
    auto c = at::empty({M, N});
    kernels::matmulInto(c, a, false, b, false, route);
    const float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>(), *pc = c.data_ptr<float>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          ref += static_cast<double>(pa[i * K + k]) * pb[k * N + j];
          mag += std::abs(static_cast<double>(pa[i * K + k]) * pb[k * N + j]);
        }
        worst = std::max(worst, std::abs(pc[i * N + j] - ref) / std::max(mag, 1e-30));
      }
  }
  return worst;
}

}  // namespace lt::train
