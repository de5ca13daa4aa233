// Ulysses sequence parallelism (DeepSpeed's ulysses_sp.py, ALST): P ranks of an SP group
// each hold 1/P of every sequence.
// - UlyssesLoader: gathers one batch from each SP rank's loader, forms shift_labels on the
//   whole sequence (so a shard boundary keeps its next-token label), slices each of the P
//   batches into P sequence shards and serves them from an O(1) Fifo: rank 0's batch first.
// - ulyssesAttention: q/k/v of the local shard [B, S/P, H, Dh] are all-to-all'd into head
//   shards [B, S, H/P, Dh], attended causally over the whole sequence, and all-to-all'd back.
//   Autograd flows through both all-to-alls (each one's backward is the other).
//   Pipelined (UlyssesPipeline, the fused core): the rank's heads are cut into G groups on
//   kv-head boundaries and one autograd Function runs the kernel per group, group g+1's q/k/v
//   all-to-all (and group g-1's output one) in flight while group g computes; backward mirrors
//   it. Each group's all-to-all is one call: its send buffer holds, for every destination
//   rank, that rank's g-th group of q, k and v side by side. The kernel computes every head on
//   its own, so the result has the bits of G = 1.
#pragma once
#include <functional>
#include <memory>
#include <optional>

#include "longtrain/comm/comm.h"
#include "longtrain/core/fifo.h"
#include "longtrain/data/data.h"
#include "longtrain/model/model.h"
#include "longtrain/sp/layout.h"

namespace lt::sp {

// The source of one SP rank's batches (its own data loader): never ends, as the training
// stream is infinite (epochs are the loader's business).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual data::Batch next() = 0;
};

// Wraps a data::Loader.
class LoaderSource : public BatchSource {
 public:
  explicit LoaderSource(std::unique_ptr<data::Loader> l) : loader_(std::move(l)) {}
  data::Batch next() override { return loader_->next(); }
  data::Loader& loader() { return *loader_; }

 private:
  std::unique_ptr<data::Loader> loader_;
};

class UlyssesLoader {
 public:
  // Shards by `layout` (sp/layout.h: contiguous or zigzag, any sequence length, padded and
  // masked); layout.P is the size of `sp`.
  UlyssesLoader(std::unique_ptr<BatchSource> src, std::shared_ptr<comm::Comm> sp, const ParallelLayout& layout);
  // The next shard (input_ids, labels, position_ids, shift_labels all [B, padded S / P]).
  // Every SP rank must call it the same number of times.
  data::Batch next();
  size_t queued() const { return fifo_.size(); }

 private:
  void refill(const data::Batch& mine);
  std::unique_ptr<BatchSource> src_;
  std::shared_ptr<comm::Comm> sp_;
  Fifo<data::Batch> fifo_;
  ParallelLayout layout_;
};

// The attention function for a model under Ulysses SP over `sp` (the AttentionFn the model's
// blocks call). `core` is the local attention over the whole sequence and a head shard.
// With pipeline.headGroups > 1 and pipeline.fused set, the pipelined Function runs the fused
// kernel itself (`core` unused); otherwise the unpipelined all-to-alls around `core`.
struct UlyssesPipeline {
  int headGroups = 1;  // G: divides the kv heads a rank holds after the all-to-all
  std::optional<kernels::FusedAttentionOptions> fused;  // the core's kernel, when it is the fused one
  int64_t window = 0;  // model.sliding_window, the fused core's mask rule
};
model::AttentionFn ulyssesAttention(std::shared_ptr<comm::Comm> sp, model::AttentionFn core,
                                    const UlyssesPipeline& pipeline = {});
// The pipeline of model `m`'s core (fused only when model.attention is "fused") over `headGroups`
// (config::ulyssesHeadGroups).
UlyssesPipeline ulyssesPipeline(const model::ModelConfig& m, int headGroups);

// The differentiable all-to-alls, exposed for tests: [B, S/P, H, D] <-> [B, S, H/P, D].
at::Tensor seqToHeads(const at::Tensor& x, comm::Comm* sp);
at::Tensor headsToSeq(const at::Tensor& x, comm::Comm* sp);

}  // namespace lt::sp
