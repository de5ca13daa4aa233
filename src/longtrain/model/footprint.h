// The bytes the model's paths hold, declared beside the code that allocates them (model.cpp,
// attention.cpp) for `longtrain plan`. Non-obvious: a block's footprint comes in two halves,
// attention and MLP, because their backwards run one after the other: the plan's peak is the
// larger half over what both halves saved.
#pragma once
#include "longtrain/config/model_config.h"
#include "longtrain/core/footprint.h"

namespace lt::model {

// model.attention's core on one rank (attentionCore: naive, chunked or fused), q and k rotated.
// `ownsInputs`: as kernels::fusedAttentionFootprint's (true under Ulysses).
Footprint attentionCoreFootprint(const config::ModelConfig& m, const StepShape& s, bool ownsInputs);
Footprint naiveAttentionFootprint(const StepShape& s);    // slidingWindowAttention (model.cpp)
Footprint chunkedAttentionFootprint(const StepShape& s);  // ChunkedFn (attention.cpp)

// Model::block's two halves, around the attention core `core` (whatever SP made of it).
struct BlockFootprint {
  Footprint attention, mlp;
  TensorBytes saved() const;  // what a block that keeps its graph holds (beyond its input)
};
BlockFootprint blockFootprint(const config::ModelConfig& m, const StepShape& s, const Footprint& core);
Footprint mlpFootprint(const config::ModelConfig& m, const StepShape& s);  // mlp / TiledMlpFn (attention.cpp)

// One loss tile of the LM head (Model::logits + lossSum, or the fused Model::headLoss): `work`
// while the tile's loss and gradient are computed, `saved` what the model keeps from step to
// step (headLoss's buffer).
Footprint headLossFootprint(const config::ModelConfig& m, const StepShape& s);

}  // namespace lt::model
