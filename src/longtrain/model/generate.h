// Autoregressive decoding with a KV cache: the prompt is run once (prefill), then one token at
// a time, each block attending to its cached keys and values. Non-obvious: it runs the same
// norm, RoPE and MLP code as training (Model::decode), so greedy decoding picks the argmax of
// the training forward at every position (tested), not that of a second implementation.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "longtrain/model/model.h"

namespace lt::model {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax)
  int64_t topK = 0;        // > 0: sample among the K most likely tokens only
  uint64_t seed = 1234;
  int64_t maxNewTokens = 64;
  int64_t stopToken = -1;  // stop after emitting it (EOS); -1: never
};

// Generates after `prompt` (token ids, at least one). `onToken` sees each new id as it comes.
// Returns the new ids (without the prompt).
std::vector<int64_t> generate(const Model& m, const std::vector<int64_t>& prompt, const SamplingOptions& o,
                              const std::function<void(int64_t)>& onToken = {});

}  // namespace lt::model
