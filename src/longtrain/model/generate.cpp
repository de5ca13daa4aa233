// Sampling loop around Model::decode. Temperature and top-k as Hugging Face's generate: logits
// divided by the temperature, all but the k largest set to -inf, then one multinomial draw.
#include "longtrain/model/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "longtrain/core/check.h"

namespace lt::model {

namespace {

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

std::vector<int64_t> generate(const Model& m, const std::vector<int64_t>& prompt, const SamplingOptions& o,
                              const std::function<void(int64_t)>& onToken) {
  LT_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token");
  for (int64_t t : prompt)
    LT_CHECK(t >= 0 && t < m.config().vocabSize, "generate: prompt token ", t, " is outside the model's vocabulary (",
             m.config().vocabSize, ")");
  at::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  KvCache cache(m, 1, static_cast<int64_t>(prompt.size()) + o.maxNewTokens);
  auto ids = at::tensor(prompt, at::kLong).unsqueeze(0);
  at::Tensor logits = m.decode(ids, cache);  // [1, T, V]
  std::vector<int64_t> out;
  for (int64_t i = 0; i < o.maxNewTokens; ++i) {
    const int64_t next = pick(logits[0][-1], o, gen);
    out.push_back(next);
    if (onToken) onToken(next);
    if (next == o.stopToken || i + 1 == o.maxNewTokens) break;
    logits = m.decode(at::full({1, 1}, next, at::kLong), cache);
  }
  return out;
}

}  // namespace lt::model
