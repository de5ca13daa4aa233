// ActivationOffload: tensors in and out of the ActivationFile. Tensors travel as their raw
// bytes (made contiguous first), so a reloaded input is bit-identical to the one written.
#include "longtrain/compile/activation_offload.h"

#include <ATen/ATen.h>

#include <chrono>

#include "longtrain/core/check.h"

namespace lt::compile {

namespace {

offload::ActivationFileOptions fileOptions(const std::string& dir, int rank, int64_t slotBytes, int slots,
                                           const std::string& purpose) {
  offload::ActivationFileOptions o;
  o.dir = dir;
  o.rank = rank;
  o.slotBytes = slotBytes;
  o.slots = slots;
  o.purpose = purpose;
  return o;
}

bool ready(const offload::Ticket& t) {
  return !t.valid() || t.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

// t.get(), adding the time it blocked to *seconds.
void timedGet(const offload::Ticket& t, double* seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  t.get();
  *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

ActivationOffload::ActivationOffload(const std::string& dir, int rank, int64_t slotBytes, int slots,
                                     const std::string& purpose)
    : file_(fileOptions(dir, rank, slotBytes, slots, purpose)) {}

ActivationOffload::Entry& ActivationOffload::entry(int block) {
  LT_ASSERT(block >= 0);
  if (block >= static_cast<int>(entries_.size())) entries_.resize(block + 1);
  return entries_[block];
}

void ActivationOffload::offload(int block, const at::Tensor& x) {
  Entry& e = entry(block);
  LT_ASSERT(!e.held, "block ", block, "'s input offloaded twice");
  if (lastWrite_.valid()) timedGet(lastWrite_, &waitSeconds_);  // one write in flight at most; rethrows its error
  auto keep = std::make_shared<at::Tensor>(x.contiguous());
  e.held = true;
  e.sizes = x.sizes().vec();
  e.dtype = x.scalar_type();
  e.bytes = static_cast<int64_t>(keep->nbytes());
  e.written = lastWrite_ = file_.write(block, keep->data_ptr(), e.bytes, keep);
}

void ActivationOffload::prefetch(int block) {
  Entry& e = entry(block);
  LT_ASSERT(e.held, "ReloadActivation(", block, ") without its OffloadActivation");
  if (e.buffer.defined()) return;  // already on its way
  e.buffer = at::empty(e.sizes, at::TensorOptions().dtype(e.dtype));
  auto keep = std::make_shared<at::Tensor>(e.buffer);
  e.read = file_.read(block, e.buffer.data_ptr(), e.bytes, keep);
}

at::Tensor ActivationOffload::take(int block) {
  prefetch(block);
  Entry& e = entries_[block];
  timedGet(e.read, &waitSeconds_);  // the write came first in the queue, so it is done too
  at::Tensor x = std::move(e.buffer);
  e.buffer = at::Tensor();
  e.held = false;
  e.read = e.written = offload::Ticket();
  return x;
}

void ActivationOffload::reset() {
  if (lastWrite_.valid()) lastWrite_.wait();
  for (auto& e : entries_) {
    if (e.written.valid()) e.written.wait();
    if (e.read.valid()) e.read.wait();
  }
  entries_.clear();
  lastWrite_ = offload::Ticket();
}

bool ActivationOffload::holds(int block) const {
  return block >= 0 && block < static_cast<int>(entries_.size()) && entries_[block].held;
}

int64_t ActivationOffload::residentBytes() const {
  int64_t n = 0;
  for (const auto& e : entries_)
    if (e.held && (e.buffer.defined() || !ready(e.written))) n += e.bytes;
  return n;
}

int64_t ActivationOffload::offloadedBytes() const {
  int64_t n = 0;
  for (const auto& e : entries_)
    if (e.held) n += e.bytes;
  return n;
}

}  // namespace lt::compile
