// Gradient buckets aligned with optimizer sub-groups (DeepSpeed SuperOffload's
// reduce_independent_p_g_buckets_and_remove_grads, with its later bugs designed out).
// One bucket = one sub-group. A gradient of the current sub-group joins the bucket; a
// gradient of any other sub-group waits in an O(1) Fifo. When the bucket holds all of its
// sub-group's gradients it is handed to `onComplete` (which reduce-scatters it), and the
// waiting gradients drain in arrival order, the first of them choosing the next bucket.
// - Single-parameter sub-groups complete on arrival.
// - Sub-groups are global ids, so several parameter groups cannot collide (DeepSpeed #7905).
// - World size 1 is not special here (DeepSpeed #7925): onComplete decides what "reduce" is.
// - A parameter that gets no gradient in a step: finish() completes every unfinished
//   sub-group, passing the gradients that did arrive; the missing ones count as zero.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "longtrain/core/fifo.h"

namespace lt::zero {

struct GradItem {
  int param = -1;     // global parameter index
  int subGroup = -1;  // its optimizer sub-group
  at::Tensor grad;    // full (unpartitioned) gradient
};

class IpgBuckets {
 public:
  // paramsPerSubGroup[s]: how many parameters sub-group s has.
  IpgBuckets(std::vector<int> paramsPerSubGroup,
             std::function<void(int subGroup, std::vector<GradItem>& items)> onComplete);

  void add(GradItem item);
  // End of backward: completes the current bucket and every waiting or untouched-but-started
  // sub-group in arrival order; then every sub-group not seen at all (in id order).
  void finish();

  int current() const { return current_; }
  size_t waiting() const { return waiting_.size(); }
  const std::vector<int>& completionOrder() const { return order_; }
  void resetStep();

 private:
  // Returns true if `item` completed the current bucket.
  bool place(GradItem&& item);
  void complete();
  void drain();

  std::vector<int> expected_;
  std::function<void(int, std::vector<GradItem>&)> onComplete_;
  std::vector<char> done_;
  int current_ = -1;
  std::vector<GradItem> bucket_;
  Fifo<GradItem> waiting_;
  std::vector<int> order_;  // sub-groups in completion order (this step)
};

}  // namespace lt::zero
