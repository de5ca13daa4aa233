// ParallelLayout's rules. The error for a forced ring degree lists the degrees that would work.
#include "longtrain/config/parallel_layout.h"

#include <sstream>

#include "longtrain/core/check.h"

namespace lt::config {

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

int chooseRing(int P, int64_t heads, int64_t kvHeads, int forcedRing) {
  if (forcedRing == 0) {
    for (int u = P; u >= 1; --u)
      if (P % u == 0 && headsAllow(u, heads, kvHeads)) return P / u;
    LT_ASSERT(false, "U = 1 always fits");
  }
  LT_CHECK(P % forcedRing == 0, "sequence_parallel_ring_degree=", forcedRing, " does not divide ",
           "sequence_parallel_size=", P, "; choose one of: ", validRingDegrees(P, heads, kvHeads),
           " (or 0: chosen from the head counts)");
  LT_CHECK(headsAllow(P / forcedRing, heads, kvHeads), "sequence_parallel_ring_degree=", forcedRing,
           " leaves a Ulysses degree ", P / forcedRing, " that model.num_heads=", heads, " and model.num_kv_heads=",
           kvHeads, " do not allow (heads must divide by it, kv heads divide by it or into it); choose one of: ",
           validRingDegrees(P, heads, kvHeads));
  return forcedRing;
}

}  // namespace

ParallelLayout ParallelLayout::make(int world, int P, int64_t heads, int64_t kvHeads, int forcedRing,
                                    SpBalance balance) {
  LT_CHECK(world >= 1 && P >= 1 && world % P == 0, "sequence_parallel_size=", P, " does not divide the world size ",
           world, " (the ranks launched: --nproc, or train.nproc, times --nnodes); launch a multiple of ", P,
           " ranks, e.g. --nproc ", (world + P - 1) / P * P, ", or choose a sequence_parallel_size that divides ",
           world);
  LT_CHECK(heads >= 1 && kvHeads >= 1 && heads % kvHeads == 0, "model.num_heads=", heads,
           " must be divisible by model.num_kv_heads=", kvHeads);
  LT_CHECK(forcedRing >= 0, "sequence_parallel_ring_degree=", forcedRing, " must be 0 (chosen) or positive");
  ParallelLayout l;
  l.world = world;
  l.P = P;
  l.dp = world / P;
  l.R = chooseRing(P, heads, kvHeads, forcedRing);
  l.U = P / l.R;
  // One rank holds everything: nothing to balance.
  l.zigzag = P > 1 && (balance == SpBalance::Zigzag || (balance == SpBalance::Auto && l.R > 1));
  return l;
}

std::string ParallelLayout::describe() const {
  std::ostringstream s;
  s << "Ulysses " << U << " x ring " << R << ", " << (zigzag ? "zigzag" : "contiguous");
  return s.str();
}

ParallelLayout::Groups ParallelLayout::ulyssesGroups() const {
  Groups out;
  for (int first = 0; first < world; first += U) {
    out.emplace_back();
    for (int i = 0; i < U; ++i) out.back().push_back(first + i);
  }
  return out;
}

ParallelLayout::Groups ParallelLayout::ringGroups() const {
  Groups out;
  for (int sp = 0; sp < world; sp += P)
    for (int u = 0; u < U; ++u) {
      out.emplace_back();
      for (int r = 0; r < R; ++r) out.back().push_back(sp + spRankOf(r, u));
    }
  return out;
}

}  // namespace lt::config
