// The bytes sequence parallelism's attention holds, declared beside its code (ring_attention.cpp,
// ulysses.cpp) for `longtrain plan`. Non-obvious: the choice of core (Ulysses around the model's
// core, or the ring kernel with Ulysses around it) is made here exactly as
// sequenceParallelAttention makes it, so the plan counts the kernel that runs.
#pragma once
#include "longtrain/config/config.h"
#include "longtrain/core/footprint.h"

namespace lt::sp {

// The attention core of a rank of `c`'s SP layout (P = 1: the model's core alone).
Footprint attentionFootprint(const config::Config& c, const StepShape& s);
Footprint ringAttentionFootprint(const StepShape& s);  // RingFn
// Ulysses' all-to-alls (seqToHeads/headsToSeq) around a core: their backward's buffers.
Footprint ulyssesFootprint(const StepShape& s);
// The pipelined Ulysses attention over `groups` head groups (PipelinedUlyssesFn): the fused
// kernel and the all-to-alls together, in place of the two above.
Footprint ulyssesPipelineFootprint(const StepShape& s, int groups);

}  // namespace lt::sp
