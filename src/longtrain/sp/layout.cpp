// Token placement (contiguous or zigzag) and padded sharding.
#include "longtrain/sp/layout.h"

#include <ATen/ATen.h>

#include "longtrain/core/check.h"

namespace lt::sp {

at::Tensor tokenIndex(const ParallelLayout& layout, int spRank, int64_t n) {
  if (!layout.zigzag) return at::arange(spRank * n, (spRank + 1) * n, at::kLong);
  LT_ASSERT(n % 2 == 0);
  const int64_t c = n / 2, P = layout.P;
  return at::cat({at::arange(spRank * c, (spRank + 1) * c, at::kLong),
                  at::arange((2 * P - 1 - spRank) * c, (2 * P - spRank) * c, at::kLong)});
}

data::Batch shardBatch(const data::Batch& whole, int spRank, const ParallelLayout& layout) {
  const int64_t B = whole.input_ids.size(0), S = whole.input_ids.size(1), Sp = layout.paddedLength(S);
  const int64_t pad = Sp - S;
  auto shift = whole.shift_labels.defined() ? whole.shift_labels : data::shiftLabels(whole.labels);
  auto padded = [&](const at::Tensor& t, const at::Tensor& fill) {
    return pad == 0 ? t : at::cat({t, fill}, 1);
  };
  auto ignore = at::full({B, pad}, data::kIgnoreIndex, at::kLong);
  auto idx = tokenIndex(layout, spRank, Sp / layout.P);
  auto take = [&](const at::Tensor& t) { return t.index_select(1, idx).contiguous(); };
  data::Batch out;
  out.input_ids = take(padded(whole.input_ids, at::zeros({B, pad}, at::kLong)));
  out.labels = take(padded(whole.labels, ignore));
  out.position_ids = take(padded(whole.position_ids, at::arange(pad, at::kLong).unsqueeze(0).expand({B, pad})));
  out.shift_labels = take(padded(shift, ignore));
  return out;
}

}  // namespace lt::sp
