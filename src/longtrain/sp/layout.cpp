// SP layout: the U x R choice, token placement (contiguous or zigzag) and padded sharding.
// Non-obvious: shift_labels are formed before padding, so the last real token keeps label -100
// exactly as on one rank, and the padding carries -100 throughout.
#include "longtrain/sp/layout.h"

#include <ATen/ATen.h>

#include <sstream>

#include "longtrain/core/check.h"

namespace lt::sp {

namespace {

bool headsAllow(int u, int64_t heads, int64_t kvHeads) {
  return heads % u == 0 && (kvHeads % u == 0 || u % kvHeads == 0);
}

std::string validRingDegrees(int P, int64_t heads, int64_t kvHeads) {
  std::ostringstream s;
  const char* sep = "";
  for (int r = 1; r <= P; ++r)
    if (P % r == 0 && headsAllow(P / r, heads, kvHeads)) s << sep << r, sep = ", ";
  return s.str();
}

}  // namespace

at::Tensor Layout::tokenIndex(int spRank, int64_t n) const {
  if (!zigzag) return at::arange(spRank * n, (spRank + 1) * n, at::kLong);
  LT_ASSERT(n % 2 == 0);
  const int64_t c = n / 2;
  return at::cat({at::arange(spRank * c, (spRank + 1) * c, at::kLong),
                  at::arange((2 * P - 1 - spRank) * c, (2 * P - spRank) * c, at::kLong)});
}

std::string Layout::describe() const {
  std::ostringstream s;
  s << "Ulysses " << U << " x ring " << R << ", " << (zigzag ? "zigzag" : "contiguous");
  return s.str();
}

Layout chooseLayout(int P, int64_t heads, int64_t kvHeads, int forcedRing, const std::string& balance) {
  Layout l;
  l.P = P;
  if (forcedRing > 0) {
    LT_CHECK(P % forcedRing == 0, "sequence_parallel_ring_degree=", forcedRing, " does not divide ",
             "sequence_parallel_size=", P, "; choose one of: ", validRingDegrees(P, heads, kvHeads),
             " (or 0: chosen from the head counts)");
    LT_CHECK(headsAllow(P / forcedRing, heads, kvHeads), "sequence_parallel_ring_degree=", forcedRing,
             " leaves a Ulysses degree ", P / forcedRing, " that model.num_heads=", heads, " and model.num_kv_heads=",
             kvHeads, " do not allow (heads must divide by it, kv heads divide by it or into it); choose one of: ",
             validRingDegrees(P, heads, kvHeads));
    l.R = forcedRing;
  } else {
    for (int u = P; u >= 1; --u)
      if (P % u == 0 && headsAllow(u, heads, kvHeads)) {
        l.R = P / u;
        break;
      }
  }
  l.U = P / l.R;
  LT_CHECK(balance == "auto" || balance == "contiguous" || balance == "zigzag", "sequence_parallel_balance=\"",
           balance, "\" is not one of \"auto\", \"contiguous\", \"zigzag\"");
  l.zigzag = balance == "zigzag" || (balance == "auto" && l.R > 1);
  if (P == 1) l.zigzag = false;  // one rank holds everything: nothing to balance
  return l;
}

data::Batch shardBatch(const data::Batch& whole, int spRank, const Layout& layout) {
  const int64_t B = whole.input_ids.size(0), S = whole.input_ids.size(1), Sp = layout.paddedLength(S);
  const int64_t pad = Sp - S;
  auto shift = whole.shift_labels.defined() ? whole.shift_labels : data::shiftLabels(whole.labels);
  auto padded = [&](const at::Tensor& t, const at::Tensor& fill) {
    return pad == 0 ? t : at::cat({t, fill}, 1);
  };
  auto ignore = at::full({B, pad}, data::kIgnoreIndex, at::kLong);
  auto idx = layout.tokenIndex(spRank, Sp / layout.P);
  auto take = [&](const at::Tensor& t) { return t.index_select(1, idx).contiguous(); };
  data::Batch out;
  out.input_ids = take(padded(whole.input_ids, at::zeros({B, pad}, at::kLong)));
  out.labels = take(padded(whole.labels, ignore));
  out.position_ids = take(padded(whole.position_ids, at::arange(pad, at::kLong).unsqueeze(0).expand({B, pad})));
  out.shift_labels = take(padded(shift, ignore));
  return out;
}

}  // namespace lt::sp
