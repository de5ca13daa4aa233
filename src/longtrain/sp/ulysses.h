// Ulysses sequence parallelism (DeepSpeed's ulysses_sp.py, ALST): P ranks of an SP group
// each hold 1/P of every sequence.
// - UlyssesLoader: gathers one batch from each SP rank's loader, forms shift_labels on the
//   whole sequence (so a shard boundary keeps its next-token label), slices each of the P
//   batches into P sequence shards and serves them from an O(1) Fifo: rank 0's batch first.
// - ulyssesAttention: q/k/v of the local shard [B, S/P, H, Dh] are all-to-all'd into head
//   shards [B, S, H/P, Dh], attended causally over the whole sequence, and all-to-all'd back.
//   Autograd flows through both all-to-alls (each one's backward is the other).
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

// A finite (per epoch) source of batches: DeepSpeed's wrapped DataLoader.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual std::optional<data::Batch> next() = 0;  // nullopt: end of epoch
  virtual void reset() = 0;                       // start the next epoch
  virtual int64_t length() const = 0;             // batches per epoch (-1: unbounded)
};

// Wraps an infinite data::Loader (never ends an epoch).
class LoaderSource : public BatchSource {
 public:
  explicit LoaderSource(std::unique_ptr<data::Loader> l) : loader_(std::move(l)) {}
  std::optional<data::Batch> next() override { return loader_->next(); }
  void reset() override {}
  int64_t length() const override { return -1; }
  data::Loader& loader() { return *loader_; }

 private:
  std::unique_ptr<data::Loader> loader_;
};

class UlyssesLoader {
 public:
  UlyssesLoader(std::unique_ptr<BatchSource> src, std::shared_ptr<comm::Comm> sp);
  // With a layout: shards by it (sp/layout.h: zigzag, any sequence length, padded and masked).
  UlyssesLoader(std::unique_ptr<BatchSource> src, std::shared_ptr<comm::Comm> sp, const Layout& layout);
  // The next shard (input_ids, labels, position_ids, shift_labels all [B, S/P]); nullopt at
  // the end of an epoch, after which the source has been reset and the next call starts the
  // next epoch. Every SP rank must call it the same number of times.
  std::optional<data::Batch> next();
  int64_t length() const;  // P x the source's length (-1: unbounded)
  size_t queued() const { return fifo_.size(); }
  BatchSource& source() { return *src_; }

 private:
  void refill(const data::Batch* mine);
  std::unique_ptr<BatchSource> src_;
  std::shared_ptr<comm::Comm> sp_;
  Fifo<data::Batch> fifo_;
  std::optional<Layout> layout_;  // none: contiguous shards, lengths must divide by P
};

// Shards one whole batch for SP rank `rank` of `size`: forms shift_labels (if absent) on the
// full sequence, then slices every field to [:, chunk*rank : chunk*(rank+1)].
data::Batch shardBatch(const data::Batch& whole, int rank, int size);

// Validates head counts for SP degree P at start-up (clear errors, DeepSpeed's rules).
void checkHeads(int64_t heads, int64_t kvHeads, int p);

// The attention function for a model under Ulysses SP over `sp` (the AttentionFn the model's
// blocks call). `core` is the local attention over the whole sequence and a head shard.
model::AttentionFn ulyssesAttention(std::shared_ptr<comm::Comm> sp, model::AttentionFn core);

// The differentiable all-to-alls, exposed for tests: [B, S/P, H, D] <-> [B, S, H/P, D].
at::Tensor seqToHeads(const at::Tensor& x, comm::Comm* sp);
at::Tensor headsToSeq(const at::Tensor& x, comm::Comm* sp);

}  // namespace lt::sp
