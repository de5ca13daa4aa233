// Decoding through Model::block with a cache-attending core, and the sampling loop around it.
// Temperature and top-k as Hugging Face's generate: logits divided by the temperature, all but
// the k largest set to -inf, then one multinomial draw.
#include "longtrain/model/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "longtrain/core/check.h"

namespace lt::model {

namespace {

// T new queries q [B, T, H, Dh] at positions past.. over the keys and values [B, past + T, KV, Dh]
// (plain softmax: decoding steps are one query long, and a prompt's [T, T] scores are small next
// to training's). With a sliding window W only keys from lo, the last W - 1 cached and the new
// ones, are read.
at::Tensor attendToCache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t past, int64_t window) {
  const int64_t H = q.size(2), KV = k.size(2), Dh = q.size(3), T = q.size(1), total = past + T;
  const int64_t lo = window > 0 ? std::max<int64_t>(0, past - (window - 1)) : 0;
  auto keys = k.narrow(1, lo, total - lo), values = v.narrow(1, lo, total - lo);
  if (KV != H) {
    keys = keys.repeat_interleave(H / KV, 2);
    values = values.repeat_interleave(H / KV, 2);
  }
  auto scores = at::matmul(q.transpose(1, 2), keys.transpose(1, 2).transpose(-2, -1)) / std::sqrt(double(Dh));
  auto rows = at::arange(past, total, at::kLong).unsqueeze(1), cols = at::arange(lo, total, at::kLong).unsqueeze(0);
  auto hidden = cols > rows;
  if (window > 0) hidden = hidden | (cols <= rows - window);
  scores = scores.masked_fill(hidden, -std::numeric_limits<float>::infinity());  // [B, H, T, total - lo]
  return at::matmul(at::softmax(scores, -1), values.transpose(1, 2)).transpose(1, 2);  // [B, T, H, Dh]
}

// Block b's attention core while decoding: writes the new tokens' k and v at the cache's length.
AttentionFn cachedAttention(KvCache& cache, int b, int64_t window) {
  return [&cache, b, window](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor&) {
    const int64_t past = cache.length, T = q.size(1);
    cache.k[b].narrow(1, past, T).copy_(k);
    cache.v[b].narrow(1, past, T).copy_(v);
    return attendToCache(q, cache.k[b].narrow(1, 0, past + T), cache.v[b].narrow(1, 0, past + T), past, window);
  };
}

int64_t pick(const at::Tensor& logits, const SamplingOptions& o, at::Generator& gen) {
  if (o.temperature <= 0) return logits.argmax().item<int64_t>();
  auto l = logits / o.temperature;
  if (o.topK > 0 && o.topK < l.size(0)) {
    auto kth = std::get<0>(l.topk(o.topK)).min();
    l = l.masked_fill(l < kth, -std::numeric_limits<float>::infinity());
  }
  return at::multinomial(at::softmax(l.to(at::kDouble), 0), 1, false, gen).item<int64_t>();
}

}  // namespace

KvCache::KvCache(const ModelConfig& c, int64_t batch, int64_t cap) : capacity(cap) {
  for (int64_t b = 0; b < c.layers; ++b) {
    k.push_back(at::empty({batch, cap, c.kvHeads, c.headDim()}, at::kFloat));
    v.push_back(at::empty({batch, cap, c.kvHeads, c.headDim()}, at::kFloat));
  }
}

at::Tensor decode(Model& m, const at::Tensor& ids, KvCache& cache) {
  const int64_t T = ids.size(1);
  LT_CHECK(cache.length + T <= cache.capacity, "decode: the KV cache holds ", cache.capacity, " tokens, ",
           cache.length + T, " asked for");
  auto pos = (at::arange(T, at::kLong) + cache.length).unsqueeze(0).expand({ids.size(0), T});
  auto x = m.embed(ids);
  for (int b = 0; b < m.numBlocks(); ++b) x = m.block(b, x, pos, cachedAttention(cache, b, m.config().slidingWindow));
  cache.length += T;
  return m.logits(x);
}

std::vector<int64_t> generate(Model& m, const std::vector<int64_t>& prompt, const SamplingOptions& o,
                              const std::function<void(int64_t)>& onToken) {
  LT_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token");
  for (int64_t t : prompt)
    LT_CHECK(t >= 0 && t < m.config().vocabSize, "generate: prompt token ", t, " is outside the model's vocabulary (",
             m.config().vocabSize, ")");
  at::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  KvCache cache(m.config(), 1, static_cast<int64_t>(prompt.size()) + o.maxNewTokens);
  auto ids = at::tensor(prompt, at::kLong).unsqueeze(0);
  at::Tensor logits = decode(m, ids, cache);  // [1, T, V]
  std::vector<int64_t> out;
  for (int64_t i = 0; i < o.maxNewTokens; ++i) {
    const int64_t next = pick(logits[0][-1], o, gen);
    out.push_back(next);
    if (onToken) onToken(next);
    if (next == o.stopToken || i + 1 == o.maxNewTokens) break;
    logits = decode(m, at::full({1, 1}, next, at::kLong), cache);
  }
  return out;
}

}  // namespace lt::model
