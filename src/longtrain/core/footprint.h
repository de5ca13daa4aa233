// Footprints: the bytes an op holds, declared by the code that allocates them (a footprint
// function beside each kernel and model path; `longtrain plan` sums them along the step
// program). Non-obvious: a footprint lists tensors (count x bytes each), not one byte total,
// because what the allocator keeps of a freed tensor depends on its size (plan/memory_model.cpp);
// sizes are doubles, so a naive [B, H, S, S] at S = 2^24 overflows nothing.
#pragma once
#include <vector>

namespace lt {

// Tensors of one kind: `count` of `each` bytes per term. A count may be fractional (a bf16
// copy of an fp32 tensor is half of one).
struct TensorBytes {
  struct Term {
    double count = 0, each = 0;
  };
  std::vector<Term> terms;
  void add(double count, double each) {
    if (count > 0 && each > 0) terms.push_back({count, each});
  }
  void add(const TensorBytes& o) { terms.insert(terms.end(), o.terms.begin(), o.terms.end()); }
  double total() const {
    double n = 0;
    for (const auto& t : terms) n += t.count * t.each;
    return n;
  }
};

// What an op holds per rank: `saved` from its forward to its backward (what autograd or the
// op keeps), `work` only while its backward runs (gradients, tiles, receive buffers), `scratch`
// within one call that frees it before anything else is allocated (a GEMM's widened operands):
// the allocator hands the same span back to the next call, so it leaves no fragment behind.
struct Footprint {
  TensorBytes saved, work, scratch;
  void add(const Footprint& o) {
    saved.add(o.saved);
    work.add(o.work);
    scratch.add(o.scratch);
  }
};

// The shapes footprints are functions of, per rank. Tokens are padded (config::ParallelLayout).
struct StepShape {
  double batch = 1;         // B: sequences per micro-batch
  double seq = 0;           // S: the padded sequence length
  double tokens = 0;        // S/P: the tokens a rank holds
  double sp = 1;            // P = ulysses x ring
  double ulysses = 1, ring = 1;
  double hidden = 0;        // D
  double heads = 0, kvHeads = 0, headDim = 0;
  double intermediate = 0;  // F
  double vocab = 0;         // V
  double attentionTile = 256;  // the chunked attention's tile (model.attention_chunk, 0: 256)
  double attentionChunk = 0;   // model.attention_chunk as given (0: the fused kernel's own tile)
  bool attentionBf16 = false;  // the fused attention's tile products in bf16
  double threads = 1;          // intra-op threads a rank runs (each with a kernel's scratch)
  double lossTile = 0;      // tokens per sequence in one loss tile (Executor::lossTile)
  // One fp32 tensor of [B, S/P, n] (units the model paths count in).
  double rows(double n) const { return batch * tokens * n * 4; }
};

}  // namespace lt
