// Autoregressive decoding with a KV cache: the prompt is run once (prefill), then one token at
// a time. Non-obvious: decoding runs Model::block itself, the training code, with only the
// attention core swapped for one that appends k and v to the cache and attends over it, so greedy
// decoding picks the argmax of the training forward at every position (tested).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "longtrain/model/model.h"

namespace lt::model {

// Keys and values of every block, rotated ([B, capacity, KV, Dh] each, filled to `length`).
struct KvCache {
  KvCache(const ModelConfig& c, int64_t batch, int64_t capacity);
  std::vector<at::Tensor> k, v;
  int64_t length = 0, capacity = 0;
};

// The logits [B, T, V] of `ids` [B, T], the tokens following the cache's; their keys and values
// are appended to it. Call under no-grad.
at::Tensor decode(Model& m, const at::Tensor& ids, KvCache& cache);

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax)
  int64_t topK = 0;        // > 0: sample among the K most likely tokens only
  uint64_t seed = 1234;
  int64_t maxNewTokens = 64;
  int64_t stopToken = -1;  // stop after emitting it (EOS); -1: never
};

// Generates after `prompt` (token ids, at least one). `onToken` sees each new id as it comes.
// Returns the new ids (without the prompt).
std::vector<int64_t> generate(Model& m, const std::vector<int64_t>& prompt, const SamplingOptions& o,
                              const std::function<void(int64_t)>& onToken = {});

}  // namespace lt::model
