// IPG bucket state machine. Draining re-offers each waiting item once per pass, in order;
// an item of a sub-group other than the (new) current one goes back to the tail, so the
// relative arrival order of waiting items is preserved. Passes repeat while a pass completed
// a bucket (which frees the current slot for the next waiting sub-group).
#include "longtrain/zero/ipg_bucket.h"

#include "longtrain/core/check.h"

namespace lt::zero {

IpgBuckets::IpgBuckets(std::vector<int> paramsPerSubGroup,
                       std::function<void(int, std::vector<GradItem>&)> onComplete)
    : expected_(std::move(paramsPerSubGroup)), onComplete_(std::move(onComplete)), done_(expected_.size(), 0) {
  for (int e : expected_) LT_ASSERT(e > 0, "an empty sub-group");
}

void IpgBuckets::resetStep() {
  LT_ASSERT(current_ < 0 && waiting_.empty() && bucket_.empty(), "resetStep with gradients pending");
  std::fill(done_.begin(), done_.end(), 0);
  order_.clear();
}

bool IpgBuckets::place(GradItem&& item) {
  LT_ASSERT(item.subGroup >= 0 && item.subGroup < static_cast<int>(expected_.size()));
  LT_ASSERT(!done_[item.subGroup], "a gradient for sub-group ", item.subGroup, " arrived after it was reduced");
  if (current_ < 0) current_ = item.subGroup;
  if (item.subGroup != current_) {
    waiting_.push(std::move(item));
    return false;
  }
  bucket_.push_back(std::move(item));
  if (static_cast<int>(bucket_.size()) == expected_[current_]) {
    complete();
    return true;
  }
  return false;
}

void IpgBuckets::complete() {
  int sg = current_;
  done_[sg] = 1;
  order_.push_back(sg);
  current_ = -1;
  std::vector<GradItem> items;
  items.swap(bucket_);
  onComplete_(sg, items);
}

void IpgBuckets::drain() {
  bool progressed = true;
  while (progressed && !waiting_.empty()) {
    progressed = false;
    for (size_t n = waiting_.size(); n > 0; --n) progressed |= place(waiting_.pop());
  }
}

void IpgBuckets::add(GradItem item) {
  if (place(std::move(item))) drain();
}

void IpgBuckets::finish() {
  // Whatever is still open lacks gradients that will not come this step: complete buckets
  // in arrival order, each with what it has.
  while (current_ >= 0 || !waiting_.empty()) {
    if (current_ < 0) current_ = waiting_.front().subGroup;
    complete();
    drain();
  }
  for (int sg = 0; sg < static_cast<int>(expected_.size()); ++sg)
    if (!done_[sg]) {
      current_ = sg;
      complete();
    }
}

}  // namespace lt::zero
