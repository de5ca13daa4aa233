// Llama blocks on ATen ops. Each parameter's init draws from its own generator seeded by
// (seed, parameter index), so the result does not depend on creation order or rank.
#include "longtrain/model/model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

#include "longtrain/core/check.h"
#include "longtrain/kernels/footprint.h"
#include "longtrain/kernels/fused_attention.h"
#include "longtrain/kernels/fused_ops.h"
#include "longtrain/kernels/gemm.h"
#include "longtrain/model/attention.h"
#include "longtrain/model/footprint.h"

namespace lt::model {

at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  auto var = x.pow(2).mean(-1, /*keepdim=*/true);
  return x * at::rsqrt(var + eps) * w;
}

namespace {

// YaRN: the dims whose wavelengths fit beta_fast rotations into the original context keep their
// frequency, those with fewer than beta_slow rotations are divided by `factor`, and a linear
// ramp over the dims between blends the two (transformers' _compute_yarn_parameters).
at::Tensor yarnInverseFrequencies(const at::Tensor& inv, int64_t headDim, double theta, const RopeScaling& sc) {
  const double d = static_cast<double>(headDim);
  const auto correctionDim = [&](double rotations) {
    return d * std::log(static_cast<double>(sc.originalMaxPositions) / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  double low = correctionDim(sc.betaFast), high = correctionDim(sc.betaSlow);
  if (sc.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, d - 1);
  if (low == high) high += 0.001;  // as transformers: no division by zero
  auto f = inv.to(at::kDouble);
  auto ramp = ((at::arange(headDim / 2, f.options()) - low) / (high - low)).clamp(0, 1);
  return f / sc.factor * ramp + f * (1 - ramp);
}

}  // namespace

at::Tensor ropeInverseFrequencies(int64_t headDim, double theta, const RopeScaling& sc, at::ScalarType dtype) {
  const int64_t half = headDim / 2;
  auto inv = at::pow(theta, at::arange(0, half, at::TensorOptions().dtype(dtype)) * (-2.0 / static_cast<double>(headDim)));
  using config::RopeType;
  if (sc.type == RopeType::None) return inv;
  if (sc.type == RopeType::Linear) return inv / sc.factor;
  if (sc.type == RopeType::Yarn) return yarnInverseFrequencies(inv, headDim, theta, sc).to(dtype);
  LT_CHECK(sc.type == RopeType::Llama3, "rope_scaling type \"", sc.type, "\" is not implemented");
  // Wavelengths beyond old / low_freq_factor are slowed by `factor`, those below old /
  // high_freq_factor kept, and the band between blends the two by its position in the band.
  auto f = inv.to(at::kDouble);
  const double old = static_cast<double>(sc.originalMaxPositions);
  auto wavelen = 2 * M_PI / f;
  auto smooth = (old / wavelen - sc.lowFreqFactor) / (sc.highFreqFactor - sc.lowFreqFactor);
  auto blended = (1 - smooth) * f / sc.factor + smooth * f;
  auto out = at::where(wavelen > old / sc.lowFreqFactor, f / sc.factor, at::where(wavelen < old / sc.highFreqFactor, f, blended));
  return out.to(dtype);
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& pos, double theta, const RopeScaling& scaling) {
  int64_t d = x.size(-1), half = d / 2;
  auto inv = ropeInverseFrequencies(d, theta, scaling, x.scalar_type());  // [D/2]
  auto ang = pos.to(x.scalar_type()).unsqueeze(-1) * inv;  // [B, S, D/2]
  const double scale = scaling.attentionScale();  // yarn's attention factor, else 1
  auto cos = (at::cos(ang) * scale).unsqueeze(2), sin = (at::sin(ang) * scale).unsqueeze(2);  // [B, S, 1, D/2]
  auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

at::Tensor causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& packedPositions) {
  return slidingWindowAttention(q, k, v, packedPositions, 0);
}

at::Tensor slidingWindowAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& packedPositions, int64_t window) {
  int64_t h = q.size(2), kv = k.size(2), s = q.size(1), d = q.size(3);
  LT_ASSERT(h % kv == 0);
  auto kk = kv == h ? k : k.repeat_interleave(h / kv, 2);
  auto vv = kv == h ? v : v.repeat_interleave(h / kv, 2);
  auto qt = q.transpose(1, 2), kt = kk.transpose(1, 2), vt = vv.transpose(1, 2);  // [B, H, S, Dh]
  auto scores = at::matmul(qt, kt.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
  auto mask = at::ones({s, s}, q.options().dtype(at::kBool)).triu(1);
  if (window > 0) mask = mask | at::ones({s, s}, mask.options()).tril(-window);  // keys i - W and before
  if (packedPositions.defined()) {  // also mask keys before the query's document start
    auto start = documentStartFromPositions(packedPositions).unsqueeze(-1);  // [B, S, 1]
    auto cols = at::arange(s, start.options()).view({1, 1, s});
    mask = (mask.unsqueeze(0) | (cols < start)).unsqueeze(1);  // [B, 1, S, S]
  }
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  auto p = at::softmax(scores, -1);
  return at::matmul(p, vt).transpose(1, 2);  // [B, S, H, Dh]
}

GemmRoute gemmRoute(const ModelConfig& c) {
  return c.resolved.bf16Gemms ? GemmRoute::Bf16 : c.resolved.oneDnnGemm ? GemmRoute::OneDnn : GemmRoute::Blas;
}

bool oneDnnRunsFp32Gemms(config::GemmChoice gemm) {
  return gemm == config::GemmChoice::Auto ? kernels::oneDnnIsTheFp32Default() : gemm == config::GemmChoice::OneDnn;
}


bool attentionInBf16(const ModelConfig& c) {
  // AVX512_BF16 implies the AVX-512 build, the one FusedAttentionOptions' default isa picks there.
  return c.resolved.bf16Attention && c.attention == config::AttentionKernel::Fused && gemmRoute(c) == GemmRoute::Bf16 &&
         fusedAttentionBf16Supported();
}

FusedAttentionOptions fusedAttentionOptions(const ModelConfig& cfg) {
  FusedAttentionOptions o;
  o.tile = cfg.attentionChunk;
  o.bf16 = attentionInBf16(cfg);
  return o;
}

AttentionFn attentionCore(const ModelConfig& cfg) {
  const int64_t tile = cfg.attentionChunk, window = cfg.slidingWindow;
  if (cfg.attention == config::AttentionKernel::Naive)
    return [window](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos) {
      return slidingWindowAttention(q, k, v, pos, window);
    };
  if (cfg.attention == config::AttentionKernel::Chunked)
    return [chunk = tile > 0 ? tile : 256, window](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& pos) {
      return chunkedAttention(q, k, v, chunk, pos, window);
    };
  LT_CHECK(cfg.attention == config::AttentionKernel::Fused, "model.attention=\"", cfg.attention,
           "\" is not one of \"fused\", \"chunked\", \"naive\"");
  return [o = fusedAttentionOptions(cfg), window](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& pos) {
    if (!pos.defined() && window == 0) return fusedAttention(q, k, v, o);
    FusedAttentionOptions masked = o;
    masked.documentStart = firstVisibleKey(pos, q.size(0), q.size(1), window);
    return fusedAttention(q, k, v, masked);
  };
}

Model::Model(const ModelConfig& cfg, uint64_t seed, bool initialize) : cfg_(cfg) {
  LT_CHECK(cfg.headDimension > 0 || cfg.hidden % cfg.heads == 0, "model.hidden_size=", cfg.hidden,
           " must be divisible by model.num_heads=", cfg.heads, " (or give model.head_dim)");
  LT_CHECK(cfg.heads % cfg.kvHeads == 0, "model.num_heads=", cfg.heads, " must be divisible by model.num_kv_heads=",
           cfg.kvHeads);
  LT_CHECK(cfg.headDim() % 2 == 0, "head dim ", cfg.headDim(), " must be even for RoPE");
  int64_t index = 0;
  auto normal = [&](std::vector<int64_t> shape, double std) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(index++));
    if (!initialize) return at::empty(shape, at::kFloat).set_requires_grad(true);
    return at::normal(0.0, std, shape, gen).set_requires_grad(true);
  };
  auto constant = [&](int64_t n, double value) {  // norms 1, biases 0 (as Hugging Face inits them)
    ++index;
    if (!initialize) return at::empty({n}, at::kFloat).set_requires_grad(true);
    return at::full({n}, value, at::kFloat).set_requires_grad(true);
  };
  auto ones = [&](int64_t n) { return constant(n, 1.0); };
  const int64_t d = cfg.hidden, qDim = cfg.qDim(), kvDim = cfg.kvHeads * cfg.headDim(), f = cfg.intermediate;
  const double std = cfg.initStd, outStd = cfg.initStd / std::sqrt(2.0 * static_cast<double>(cfg.layers));
  embed_ = normal({cfg.vocabSize, d}, std);
  for (int64_t b = 0; b < cfg.layers; ++b) {
    Block k;
    k.attnNorm = ones(d);
    k.wq = normal({qDim, d}, std);
    k.wk = normal({kvDim, d}, std);
    k.wv = normal({kvDim, d}, std);
    if (cfg.qkvBias()) k.bq = constant(qDim, 0), k.bk = constant(kvDim, 0), k.bv = constant(kvDim, 0);
    k.wo = normal({d, qDim}, outStd);
    if (cfg.oBias()) k.bo = constant(d, 0);
    if (cfg.qkNorm) k.qNorm = ones(cfg.headDim()), k.kNorm = ones(cfg.headDim());
    k.mlpNorm = ones(d);
    k.wGate = normal({f, d}, std);
    k.wUp = normal({f, d}, std);
    k.wDown = normal({d, f}, outStd);
    blocks_.push_back(k);
  }
  finalNorm_ = ones(d);
  if (!cfg.tieEmbeddings) lmHead_ = normal({cfg.vocabSize, d}, std);

  for (int64_t b = 0; b < cfg.layers; ++b) {
    auto& k = blocks_[b];
    std::string p = "model.layers." + std::to_string(b) + ".";
    std::vector<NamedParam> g{{p + "input_layernorm.weight", k.attnNorm},
                              {p + "self_attn.q_proj.weight", k.wq},
                              {p + "self_attn.k_proj.weight", k.wk},
                              {p + "self_attn.v_proj.weight", k.wv},
                              {p + "self_attn.q_proj.bias", k.bq},
                              {p + "self_attn.k_proj.bias", k.bk},
                              {p + "self_attn.v_proj.bias", k.bv},
                              {p + "self_attn.o_proj.weight", k.wo},
                              {p + "self_attn.o_proj.bias", k.bo},
                              {p + "self_attn.q_norm.weight", k.qNorm},
                              {p + "self_attn.k_norm.weight", k.kNorm},
                              {p + "post_attention_layernorm.weight", k.mlpNorm},
                              {p + "mlp.gate_proj.weight", k.wGate},
                              {p + "mlp.up_proj.weight", k.wUp},
                              {p + "mlp.down_proj.weight", k.wDown}};
    g.erase(std::remove_if(g.begin(), g.end(), [](const NamedParam& n) { return !n.tensor.defined(); }), g.end());
    groups_.push_back(std::move(g));
  }
  std::vector<NamedParam> head{{"model.norm.weight", finalNorm_}};
  if (lmHead_.defined()) head.push_back({"lm_head.weight", lmHead_});
  groups_.push_back(head);
  groups_.push_back({{"model.embed_tokens.weight", embed_}});
  for (auto& g : groups_)
    for (auto& np : g)
      np.role = np.tensor.is_same(embed_) ? ParamRole::Embedding
                : np.tensor.dim() >= 2    ? ParamRole::Matrix
                                          : ParamRole::Vector;
}

std::vector<int> Model::groupOrder() const {
  std::vector<int> order{embedGroup()};
  for (int b = 0; b < numBlocks(); ++b) order.push_back(b);
  order.push_back(headGroup());
  return order;
}

std::vector<at::Tensor> Model::parameters() const {
  std::vector<at::Tensor> out;
  for (int g : groupOrder())
    for (auto& p : groups_[g]) out.push_back(p.tensor);
  return out;
}

at::Tensor Model::embed(const at::Tensor& ids) const { return at::embedding(embed_, ids); }

void Model::embedBackward(const at::Tensor& ids, const at::Tensor& gradOut) {
  auto g = at::embedding_dense_backward(gradOut, ids, cfg_.vocabSize, /*padding_idx=*/-1, /*scale_grad=*/false);
  auto& acc = embed_.mutable_grad();
  if (acc.defined()) acc.add_(g);
  else acc = g;
}

at::Tensor Model::norm(const at::Tensor& x, const at::Tensor& w) const {
  return cfg_.fusedKernels ? fusedRmsNorm(x, w, cfg_.normEps) : rmsNorm(x, w, cfg_.normEps);
}

Model::Qkv Model::projectQkv(const Block& k, const at::Tensor& h) const {
  const int64_t B = h.size(0), S = h.size(1), H = cfg_.heads, KV = cfg_.kvHeads, Dh = cfg_.headDim();
  const GemmRoute gemm = gemmRoute(cfg_);
  Qkv r;
  if (cfg_.fusedKernels) {  // one GEMM against [wq; wk; wv], then views of its columns
    // One split, not three narrows: its backward is one cat of dq, dk, dv, where each narrow's
    // wrote a zeroed full-width gradient and autograd summed the three (8 passes a block).
    const int64_t qDim = cfg_.qDim(), kvDim = KV * Dh;
    auto qkv = linear(h, at::cat({k.wq, k.wk, k.wv}), gemm);
    if (k.bq.defined()) qkv = qkv + at::cat({k.bq, k.bk, k.bv});
    const auto parts = qkv.split_with_sizes({qDim, kvDim, kvDim}, -1);
    r.q = parts[0].reshape({B, S, H, Dh});
    r.k = parts[1].reshape({B, S, KV, Dh});
    // v contiguous now (every core copies it anyway): a view would keep the whole [B, S, q + 2 kv]
    // GEMM output alive until the block returns, through its attention and MLP.
    r.v = parts[2].reshape({B, S, KV, Dh}).contiguous();
  } else {
    auto project = [&](const at::Tensor& w, const at::Tensor& bias) {
      auto y = linear(h, w, gemm);
      return bias.defined() ? y + bias : y;
    };
    r.q = project(k.wq, k.bq).view({B, S, H, Dh});
    r.k = project(k.wk, k.bk).view({B, S, KV, Dh});
    r.v = project(k.wv, k.bv).view({B, S, KV, Dh});
  }
  if (k.qNorm.defined()) {  // Qwen3: over each head's Dh values, before RoPE
    r.q = norm(r.q, k.qNorm);
    r.k = norm(r.k, k.kNorm);
  }
  return r;
}

at::Tensor Model::outputProjection(const Block& k, const at::Tensor& a) const {
  auto y = linear(a, k.wo, gemmRoute(cfg_));
  return k.bo.defined() ? y + k.bo : y;
}

at::Tensor Model::rotate(const at::Tensor& x, const at::Tensor& pos) {
  if (!cfg_.fusedKernels) return rope(x, pos, cfg_.ropeTheta, cfg_.ropeScaling);
  auto [cos, sin] = ropeTableFor(pos);
  return fusedRope(x, {cos, sin});
}

at::Tensor Model::block(int b, const at::Tensor& x, const at::Tensor& pos, const AttentionFn& attn) {
  const auto& k = blocks_[b];
  const int64_t B = x.size(0), S = x.size(1), H = cfg_.heads, Dh = cfg_.headDim();
  auto [q, kk, v] = projectQkv(k, norm(x, k.attnNorm));
  q = rotate(q, pos);    // [B, S, H, Dh]
  kk = rotate(kk, pos);  // [B, S, KV, Dh]
  auto a = attn(q, kk, v, cfg_.resolved.packedDocuments ? pos : at::Tensor()).reshape({B, S, H * Dh});
  auto x1 = x + outputProjection(k, a);
  // DeepSpeed's default shard count; every SP rank holds S/P tokens, so all agree on it.
  const int64_t shards = cfg_.tiledMlp ? std::max<int64_t>(1, (S + cfg_.hidden - 1) / cfg_.hidden) : 1;
  return x1 + tiledMlp(norm(x1, k.mlpNorm), k.wGate, k.wUp, k.wDown, shards, {cfg_.fusedKernels, gemmRoute(cfg_)});
}

std::pair<at::Tensor, at::Tensor> Model::ropeTableFor(const at::Tensor& pos) {
  if (!rope_.pos.defined() || !rope_.pos.sizes().equals(pos.sizes()) || !at::equal(rope_.pos, pos)) {
    at::NoGradGuard ng;
    auto t = ropeTable(pos, cfg_.headDim(), cfg_.ropeTheta, cfg_.ropeScaling);
    rope_ = {pos.clone(), t.cos, t.sin};
  }
  return {rope_.cos, rope_.sin};
}

at::Tensor Model::logits(const at::Tensor& x) const {
  return linear(norm(x, finalNorm_), lmHead_.defined() ? lmHead_ : embed_, gemmRoute(cfg_));
}

// One [T, V] buffer (headBuffer_, kept between calls): the logits, then exp(logits - max), then
// dL/dlogits (kernels' softmax cross-entropy, a read and a write each); the three GEMMs read it
// (and x, w) in place.
Model::TileLoss Model::headLoss(const at::Tensor& h, const at::Tensor& shiftLabels, double scale) {
  const bool backward = scale != 0;
  const GemmRoute gemm = gemmRoute(cfg_);
  at::Tensor& w = lmHead_.defined() ? lmHead_ : embed_;
  auto hs = h.detach();
  if (backward) hs.requires_grad_(true);
  at::Tensor hn;
  {
    at::AutoGradMode grad(backward);  // the norm's graph only
    hn = norm(hs, finalNorm_);
  }
  at::NoGradGuard ng;
  const auto x = hn.detach().reshape({-1, hn.size(-1)}).contiguous(), wd = w.detach();
  const auto lab = shiftLabels.reshape({-1});
  const auto valid = lab.ne(-100);  // ignored labels, as in lossSum
  const auto target = lab.masked_fill(~valid, 0).contiguous();
  const int64_t T = x.size(0), V = wd.size(0);
  if (!headBuffer_.defined() || headBuffer_.numel() < T * V) {
    headBuffer_ = at::Tensor();  // the old one first
    headBuffer_ = at::empty({T * V}, x.options());
  }
  auto p = headBuffer_.narrow(0, 0, T * V).view({T, V});
  matmulInto(p, x, false, wd, true, gemm);
  const auto rows = softmaxCrossEntropyInPlace(p, target);  // p: exp(logits - max)
  TileLoss out;
  out.sum = rows.loss.masked_select(valid).to(at::kDouble).sum().item<double>();
  out.count = valid.sum().item<int64_t>();
  out.correct = (rows.argmax.eq(lab) & valid).sum().item<int64_t>();
  if (!backward) return out;
  softmaxCrossEntropyGradInPlace(p, target, rows.invSum, valid.to(at::kFloat) * scale);  // p: dL/dlogits
  // bf16 route: both products read one bf16 rounding of the gradient, in the buffer itself.
  const auto dLogits = gemm == GemmRoute::Bf16 ? toBf16InPlace(p) : p;
  auto& acc = w.mutable_grad();  // += dL/dW [V, D]
  if (acc.defined()) matmulAccumulate(acc, dLogits, true, x, false, gemm);
  else acc = matmul(dLogits, true, x, false, gemm);
  auto dx = matmul(dLogits, false, wd, false, gemm).view_as(hn);
  {
    at::AutoGradMode grad(true);
    hn.backward(dx);
  }
  out.gradH = hs.grad();
  return out;
}

at::Tensor Model::forward(const at::Tensor& ids, const at::Tensor& pos, const AttentionFn& attn) {
  auto x = embed(ids);
  for (int b = 0; b < numBlocks(); ++b) x = block(b, x, pos, attn);
  return logits(x);
}

LossSum lossSum(const at::Tensor& logits, const at::Tensor& shiftLabels) {
  auto flat = logits.reshape({-1, logits.size(-1)});
  auto lab = shiftLabels.reshape({-1});
  LossSum out;
  // reduction 2 = sum (at::Reduction::Sum); ignored labels contribute nothing.
  out.sum = at::cross_entropy_loss(flat, lab, {}, at::Reduction::Sum, -100);
  auto valid = lab.ne(-100);
  out.count = valid.sum().item<int64_t>();
  {
    at::NoGradGuard ng;
    out.correct = (flat.argmax(-1).eq(lab) & valid).sum().item<int64_t>();
  }
  return out;
}

// Footprints (footprint.h). Units: uD = [B, S/P, D], uKV = [B, S/P, KV x Dh], uQ = [B, S/P, H x Dh]
// (q, the attention's output and their gradients; uD unless head_dim is given), fp32.

Footprint naiveAttentionFootprint(const StepShape& s) {
  const double q = s.rows(s.heads * s.headDim), scores = s.batch * (s.heads / s.sp) * s.seq * s.seq * 4;
  Footprint f;
  // matmul copies q and k^T into contiguous operands (saved by bmm), softmax saves p ([B, H/P, S,
  // S]), p @ v its copy of v; the causal mask [S, S] is bytes.
  f.saved.add(3, q);
  f.saved.add(1, scores);
  f.saved.add(1, s.seq * s.seq);
  f.work.add(2, scores);  // at softmax's backward p, dP and dS coexist
  f.work.add(3, q);       // dq, dk, dv
  return f;
}

Footprint attentionCoreFootprint(const ModelConfig& m, const StepShape& s, bool ownsInputs) {
  if (m.attention == config::AttentionKernel::Naive) return naiveAttentionFootprint(s);
  if (m.attention == config::AttentionKernel::Chunked) return chunkedAttentionFootprint(s);
  return kernels::fusedAttentionFootprint(s, ownsInputs);
}

TensorBytes BlockFootprint::saved() const {
  TensorBytes t = attention.saved;
  t.add(mlp.saved);
  return t;
}

// The attention half: the norm, the q/k/v projections, the rotations and o_proj save (fused
// ops: one GEMM against [wq; wk; wv], which also saves that weight; the fused attention keeps a
// contiguous v), Qwen3's q/k norms their inputs (the ATen composition about twice that; biases
// are added in place of the GEMM's output: nothing), then the core; backward adds d(x1) and
// d(core output).
// Naive and chunked attention copy q, k and v into contiguous [B, H, S, Dh] operands (their own
// footprints count the copies), so the rotations and the projections' outputs are freed after
// the forward (RoPE saves only its table, unfused too); the half keeps the norm's output (the
// unfused norm also x * rsqrt) and o_proj's input, a contiguous copy of the core's output.
// Measured with tcmalloc's allocated bytes on bench/plan_accuracy.sh's row 6 (chunked, 8192
// tokens): a kept graph holds 40.5 MiB = 20.25 [B, S, D], against 20 counted here.
BlockFootprint blockFootprint(const ModelConfig& m, const StepShape& s, const Footprint& core) {
  const double uD = s.rows(s.hidden), uKV = s.rows(s.kvHeads * s.headDim), uQ = s.rows(s.heads * s.headDim);
  const bool fused = m.fusedKernels, copies = m.attention != config::AttentionKernel::Fused;
  BlockFootprint b;
  Footprint& a = b.attention;
  if (copies) {
    a.saved.add(fused ? 2 : 3, uD);
  } else if (s.sp == 1) {
    // The fused core saves the rotations q and k, v made contiguous and its output, which
    // o_proj reads in place: 2 uQ + 2 uKV, and the norm's output. Measured: row 30 (MHA, 4
    // layers) 16.2 MiB a block at 8192 tokens with its output, 7 [B, S, D] + the output
    // counted; bench/max_seq_peer.json (8 query, 4 kv heads) 49.9 MiB a graph at 8192 tokens
    // without its output, 49.9 counted.
    a.saved.add(fused ? 1 : 2, uD);
    a.saved.add(2, uQ);
    a.saved.add(2, uKV);
  } else {
    // Ulysses and the ring kernel: the core saves q, k, v as it receives them (the all-to-alls'
    // outputs, or the local shard) and its output (its own footprint); the rotations and the
    // GEMM's output are freed with the forward, and o_proj saves its own input. Measured at P = 2
    // (Ulysses) with 4 layers at 8192 tokens: each Backward frees 9.1 MiB = its graph + one
    // input, 8 [B, S/P, D] + 1 counted; at P = 4 (ring 4, and Ulysses 2 x ring 2, MHA) at 16384
    // tokens: two kept graphs hold 16.6 MiB over two kept inputs, 16 [B, S/P, D] counted.
    a.saved.add(fused ? 2 : 3, uD);
  }
  if (fused) a.saved.add(1, s.hidden * (s.heads * s.headDim + 2 * s.kvHeads * s.headDim) * 4);
  if (m.qkNorm) {
    a.saved.add(fused ? 1 : 2, uQ);
    a.saved.add(fused ? 1 : 2, uKV);
  }
  a.add(core);
  // Backward: d(x1), and o_proj's gradient of the core's output (uQ), live through the core's
  // backward. Measured on bench/max_seq_peer.json's model (hidden 256) at 16384 tokens, every
  // block recomputed: the attention half held 163.8 MiB, 145.0 counted without that uQ (16).
  // Under SP the Ulysses and ring footprints count that incoming gradient already.
  a.work.add(1, uD);
  if (s.sp == 1) a.work.add(1, uQ);
  b.mlp = mlpFootprint(m, s);
  return b;
}

// Per tile of cl tokens. Unfused: the logits [B, cl, V] are freed when lossSum returns, but
// log_softmax saves its output; backward holds it with nll's gradient and log_softmax's (3
// [B, cl, V]). Fused (headLoss): one [B, cl, V] buffer holds the logits, then the
// probabilities, then their gradient, kept from step to step. Both: the final norm's saved
// tensors and dh (3 [B, cl, D]), and the LM head's weight-gradient product (V x D), which the
// fused head accumulates in place on every route (matmulAccumulate).
Footprint headLossFootprint(const ModelConfig& m, const StepShape& s) {
  const double logits = s.batch * s.lossTile * s.vocab * 4;
  Footprint f;
  if (m.fusedKernels) f.saved.add(1, logits);
  else f.work.add(3, logits);
  f.work.add(3, s.batch * s.lossTile * s.hidden * 4);
  if (!m.fusedKernels) f.work.add(1, s.vocab * s.hidden * 4);
  if (gemmRoute(m) == GemmRoute::Bf16) {
    // The three GEMMs run one at a time, each on bf16 copies of x and w (dL/dlogits is rounded
    // in place) and with its own scratch: without oneDNN's bf16 kernel (AVX2) the widened
    // operands, [T, V] fp32 for both backward products (row 22 at 4096 tokens: the loss peaks
    // 265 MiB over its start, measured).
    const double T = s.batch * s.lossTile, V = s.vocab, D = s.hidden;
    f.work.add(1, 2 * (T * D + V * D));
    f.scratch.add(1, std::max({kernels::bf16GemmWorkBytes(false, true, T, V, D),
                            kernels::bf16GemmWorkBytes(true, false, V, D, T),
                            kernels::bf16GemmWorkBytes(true, false, V, D, T, true),  // dW from step 2: +=
                            kernels::bf16GemmWorkBytes(false, false, T, D, V)}));
  }
  return f;
}

}  // namespace lt::model
