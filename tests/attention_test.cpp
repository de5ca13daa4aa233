// The fused attention kernel against the ATen compositions it replaces (naive causal attention,
// and a dense masked softmax for the document mask): output and every input gradient, for each
// ISA this CPU runs, at lengths that are and are not tile multiples, several GQA ratios and head
// dims; plus determinism across thread counts and the argument checks.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <limits>
#include <tuple>
#include <vector>

#include "longtrain/kernels/fused_attention.h"
#include "longtrain/model/attention.h"
#include "longtrain/model/model.h"
#include "testing.h"

namespace {

using lt::kernels::Isa;
using lt::testing::relErr;
using lt::testing::Tol;

// Dense reference with an explicit mask: row s sees columns [start[s], s].
at::Tensor maskedReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& start) {
  const int64_t H = q.size(2), KV = k.size(2), S = q.size(1);
  auto kk = k.repeat_interleave(H / KV, 2).transpose(1, 2), vv = v.repeat_interleave(H / KV, 2).transpose(1, 2);
  auto scores = at::matmul(q.transpose(1, 2), kk.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  auto rows = at::arange(S, at::kLong).view({1, S, 1}), cols = at::arange(S, at::kLong).view({1, 1, S});
  auto hidden = (cols > rows) | (cols < start.unsqueeze(-1));  // [B, S, S]
  scores = scores.masked_fill(hidden.unsqueeze(1), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), vv).transpose(1, 2);
}

struct Grads {
  at::Tensor out, dq, dk, dv;
};

template <class Fn>
Grads runWithGrads(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& up, Fn fn) {
  auto q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
  auto out = fn(q, k, v);
  (out * up).sum().backward();
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

void expectClose(const Grads& got, const Grads& ref, const std::string& what) {
  EXPECT_LE(relErr(got.out, ref.out), Tol::kFusedKernel) << what << " output";
  EXPECT_LE(relErr(got.dq, ref.dq), Tol::kFusedKernel) << what << " dq";
  EXPECT_LE(relErr(got.dk, ref.dk), Tol::kFusedKernel) << what << " dk";
  EXPECT_LE(relErr(got.dv, ref.dv), Tol::kFusedKernel) << what << " dv";
}

std::vector<Isa> supportedIsas() {
  std::vector<Isa> out;
  for (auto isa : {Isa::Baseline, Isa::Avx2, Isa::Avx512})
    if (lt::kernels::isaSupported(isa)) out.push_back(isa);
  return out;
}

// B, S, H, KV, Dh, tile
using Case = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
const std::vector<Case> kCases = {
    {2, 16, 4, 4, 8, 4},    {2, 19, 4, 2, 8, 5},  {1, 7, 2, 1, 16, 64},  {1, 33, 8, 2, 4, 1},
    {1, 130, 4, 1, 16, 64}, {2, 97, 6, 3, 32, 16}, {1, 70, 2, 2, 24, 0}, {1, 257, 2, 1, 64, 0},
    {1, 1, 2, 1, 8, 0},     {1, 40, 16, 2, 128, 32}, {3, 9, 2, 2, 2, 4},
};

std::string describe(const Case& c, Isa isa) {
  auto [B, S, H, KV, D, T] = c;
  return std::string(lt::kernels::isaName(isa)) + " B" + std::to_string(B) + " S" + std::to_string(S) + " H" +
         std::to_string(H) + "/" + std::to_string(KV) + " D" + std::to_string(D) + " tile" + std::to_string(T);
}

TEST(FusedAttention, EqualsNaiveForEveryIsaShapeAndGqaRatio) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (const auto& c : kCases) {
    auto [B, S, H, KV, D, T] = c;
    auto q = at::randn({B, S, H, D}, gen), k = at::randn({B, S, KV, D}, gen), v = at::randn({B, S, KV, D}, gen);
    auto up = at::randn({B, S, H, D}, gen);
    auto ref = runWithGrads(q, k, v, up, [](auto& a, auto& b, auto& c) { return lt::model::causalAttention(a, b, c); });
    for (auto isa : supportedIsas()) {
      lt::kernels::FusedAttentionOptions o;
      o.tile = T;
      o.isa = isa;
      auto got = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& cc) { return lt::kernels::fusedAttention(a, b, cc, o); });
      expectClose(got, ref, describe(c, isa));
    }
  }
}

// Large scores (sharp softmax): the online maximum must rescale earlier tiles exactly.
TEST(FusedAttention, SharpSoftmaxAcrossTiles) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  auto q = at::randn({1, 150, 2, 16}, gen) * 6, k = at::randn({1, 150, 2, 16}, gen) * 6;
  auto v = at::randn({1, 150, 2, 16}, gen), up = at::randn({1, 150, 2, 16}, gen);
  auto ref = runWithGrads(q, k, v, up, [](auto& a, auto& b, auto& c) { return lt::model::causalAttention(a, b, c); });
  lt::kernels::FusedAttentionOptions o;
  o.tile = 16;
  auto got = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& c) { return lt::kernels::fusedAttention(a, b, c, o); });
  expectClose(got, ref, "sharp");
}

// Document mask: three packed documents per row (different cuts per batch row), including a
// one-token document and cuts that fall inside and on tile edges.
TEST(FusedAttention, DocumentMaskEqualsDenseMaskedSoftmax) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(13);
  const int64_t B = 2, S = 75, H = 4, KV = 2, D = 8;
  auto pos = at::empty({B, S}, at::kLong);
  const std::vector<std::vector<int64_t>> cuts = {{0, 16, 17, 50}, {0, 31, 64}};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      int64_t first = 0;
      for (int64_t c : cuts[b])
        if (c <= s) first = c;
      pos[b][s] = s - first;
    }
  auto start = lt::model::documentStartFromPositions(pos);
  EXPECT_EQ(start[0][20].item<int64_t>(), 17);
  auto q = at::randn({B, S, H, D}, gen), k = at::randn({B, S, KV, D}, gen), v = at::randn({B, S, KV, D}, gen);
  auto up = at::randn({B, S, H, D}, gen);
  auto ref = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& c) { return maskedReference(a, b, c, start); });
  for (auto isa : supportedIsas())
    for (int64_t tile : {16, 7}) {
      lt::kernels::FusedAttentionOptions o;
      o.documentStart = start;
      o.tile = tile;
      o.isa = isa;
      auto got = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& c) { return lt::kernels::fusedAttention(a, b, c, o); });
      expectClose(got, ref, std::string("documents ") + lt::kernels::isaName(isa) + " tile " + std::to_string(tile));
    }
  // One document spanning the row is plain causal attention, bit for bit.
  lt::kernels::FusedAttentionOptions one;
  one.documentStart = at::zeros({B, S}, at::kLong);
  auto a = lt::kernels::fusedAttention(q, k, v, one), b = lt::kernels::fusedAttention(q, k, v);
  EXPECT_TRUE(at::equal(a, b));
}

// Tasks own disjoint memory and each runs in a fixed order: the same bits on 1 and 2 threads.
// Mistral's sliding window (row i sees keys i - W < j <= i) in the fused kernel (its first-visible-
// key form: tiles left of the window skipped, partial tiles masked) and the chunked core, against
// the naive core's own window mask, forward and backward: windows of 1, below the tile, equal to
// it, not a multiple of it, and at or beyond the sequence; alone and within packed documents.
TEST(FusedAttention, SlidingWindowEqualsNaiveInEveryCore) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(14);
  const int64_t B = 2, S = 45, H = 4, KV = 2, D = 8, tile = 8;
  auto q = at::randn({B, S, H, D}, gen), k = at::randn({B, S, KV, D}, gen), v = at::randn({B, S, KV, D}, gen);
  auto up = at::randn({B, S, H, D}, gen);
  const auto documents = at::arange(S, at::kLong).remainder(17).unsqueeze(0).repeat({B, 1});  // 17, 17, 11 tokens
  for (bool packed : {false, true})
    for (int64_t w : {1, 3, 8, 13, 17, 44, 45, 100}) {
      const at::Tensor pos = packed ? documents : at::Tensor();
      const std::string what = (packed ? "documents, window " : "window ") + std::to_string(w);
      auto ref = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& c) {
        return lt::model::slidingWindowAttention(a, b, c, pos, w);
      });
      if (w < (packed ? 16 : S - 1)) {  // the window hides keys here: the reference must differ
        auto plain = lt::model::causalAttention(q, k, v, pos);
        EXPECT_GT(relErr(ref.out, plain), 1e-3) << what;
      }
      for (auto isa : supportedIsas()) {
        lt::kernels::FusedAttentionOptions o;
        o.tile = tile;
        o.isa = isa;
        o.documentStart = lt::model::firstVisibleKey(pos, B, S, w);
        auto got = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& c) { return lt::kernels::fusedAttention(a, b, c, o); });
        expectClose(got, ref, what + " fused " + lt::kernels::isaName(isa));
      }
      auto chunked = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& c) {
        return lt::model::chunkedAttention(a, b, c, tile, pos, w);
      });
      expectClose(chunked, ref, what + " chunked");
    }
}

TEST(FusedAttention, BitIdenticalAcrossThreadCounts) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(14);
  auto q = at::randn({2, 200, 4, 16}, gen), k = at::randn({2, 200, 2, 16}, gen), v = at::randn({2, 200, 2, 16}, gen);
  auto up = at::randn({2, 200, 4, 16}, gen);
  const int before = at::get_num_threads();
  auto fused = [](auto& a, auto& b, auto& c) { return lt::kernels::fusedAttention(a, b, c); };
  at::set_num_threads(1);
  auto one = runWithGrads(q, k, v, up, fused);
  at::set_num_threads(2);
  auto two = runWithGrads(q, k, v, up, fused);
  at::set_num_threads(before);
  EXPECT_TRUE(at::equal(one.out, two.out));
  EXPECT_TRUE(at::equal(one.dq, two.dq));
  EXPECT_TRUE(at::equal(one.dk, two.dk));
  EXPECT_TRUE(at::equal(one.dv, two.dv));
}

// The raw forward and backward (Ulysses' pipeline runs them per head group): run on the heads
// in two groups of kv heads (with their query heads) they give the autograd path's bits on all
// heads at once, because every head is computed on its own. With a document mask and GQA.
TEST(FusedAttention, RawPerHeadGroupEqualsAutogradBitwise) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(15);
  const int64_t B = 2, S = 150, H = 8, KV = 4, D = 16;
  auto q = at::randn({B, S, H, D}, gen), k = at::randn({B, S, KV, D}, gen), v = at::randn({B, S, KV, D}, gen);
  auto up = at::randn({B, S, H, D}, gen);
  lt::kernels::FusedAttentionOptions o;
  o.tile = 32;
  o.documentStart = at::cat({at::zeros({B, 70}, at::kLong), at::full({B, 80}, 70, at::kLong)}, 1);
  auto fused = [&](auto& a, auto& b, auto& c) { return lt::kernels::fusedAttention(a, b, c, o); };
  auto whole = runWithGrads(q, k, v, up, fused);
  for (int64_t g = 0; g < 2; ++g) {
    auto qg = q.narrow(2, g * H / 2, H / 2), kg = k.narrow(2, g * KV / 2, KV / 2);
    auto vg = v.narrow(2, g * KV / 2, KV / 2);
    auto fwd = lt::kernels::fusedAttentionForward(qg, kg, vg, o);
    auto d = lt::kernels::fusedAttentionBackward(qg, kg, vg, fwd, up.narrow(2, g * H / 2, H / 2).contiguous(), o);
    EXPECT_TRUE(at::equal(fwd.out, whole.out.narrow(2, g * H / 2, H / 2))) << "group " << g;
    EXPECT_TRUE(at::equal(d.dq, whole.dq.narrow(2, g * H / 2, H / 2))) << "group " << g;
    EXPECT_TRUE(at::equal(d.dk, whole.dk.narrow(2, g * KV / 2, KV / 2))) << "group " << g;
    EXPECT_TRUE(at::equal(d.dv, whole.dv.narrow(2, g * KV / 2, KV / 2))) << "group " << g;
  }
}

// The bf16 products' engines this CPU runs: vdpbf16ps, and AMX tiles where it has them (the
// default there). Each entry: whether it turns AMX off.
std::vector<bool> bf16EnginesAmxOff() {
  if (!lt::kernels::fusedAttentionBf16Supported()) return {};
  if (lt::kernels::fusedAttentionBf16OnAmx()) return {false, true};
  return {true};
}

// Bf16ProductsEqualNaiveWithinBf16Rounding's checks on whichever engine is on.
void expectBf16ProductsEqualNaive(const std::string& engine) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(15);
  auto check = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& start,
                   int64_t tile, const std::string& shape) {
    const std::string what = engine + " " + shape;
    auto up = at::randn(q.sizes(), gen);
    lt::kernels::FusedAttentionOptions o;
    o.tile = tile;
    o.documentStart = start;
    auto ref = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& c) {
      return start.defined() ? maskedReference(a, b, c, start) : lt::model::causalAttention(a, b, c);
    });
    auto fp32 = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& c) { return lt::kernels::fusedAttention(a, b, c, o); });
    o.bf16 = true;
    auto got = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& c) { return lt::kernels::fusedAttention(a, b, c, o); });
    const std::vector<std::pair<at::Tensor, at::Tensor>> pairs = {
        {got.out, ref.out}, {got.dq, ref.dq}, {got.dk, ref.dk}, {got.dv, ref.dv}};
    const char* names[] = {"output", "dq", "dk", "dv"};
    for (size_t i = 0; i < pairs.size(); ++i)
      EXPECT_LE(relErr(pairs[i].first, pairs[i].second), Tol::kBf16Attention) << what << " " << names[i];
    EXPECT_GT(relErr(got.out, fp32.out), 1e-5) << what << ": the bf16 products gave fp32's result";
  };
  for (const auto& c : kCases) {
    auto [B, S, H, KV, D, T] = c;
    auto q = at::randn({B, S, H, D}, gen), k = at::randn({B, S, KV, D}, gen), v = at::randn({B, S, KV, D}, gen);
    check(q, k, v, at::Tensor(), T, describe(c, Isa::Avx512Bf16));
  }
  const int64_t B = 1, S = 75, H = 4, KV = 2, D = 16;
  auto pos = at::cat({at::arange(20, at::kLong), at::arange(1, at::kLong), at::arange(54, at::kLong)}).view({B, S});
  auto q = at::randn({B, S, H, D}, gen), k = at::randn({B, S, KV, D}, gen), v = at::randn({B, S, KV, D}, gen);
  check(q, k, v, lt::model::documentStartFromPositions(pos), 16, "documents bf16");
}

// bf16 tile products (AVX512_BF16, and AMX where the CPU has it): every product's operands rounded
// to bf16, sums in fp32. Against naive fp32 attention within the bf16 tolerance at every shape (odd
// lengths give odd reduction lengths, whose last pair is padded; lengths off the 16-row tiles),
// GQA ratio and the document mask; and measurably not the fp32 kernel (a dispatch that silently ran
// fp32 would pass the tolerance otherwise). On an AMX CPU the two engines sum the pairs in other
// orders, so their outputs differ in some bits: the check that AMX ran at all.
TEST(FusedAttention, Bf16ProductsEqualNaiveWithinBf16Rounding) {
  if (!lt::kernels::fusedAttentionBf16Supported()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  for (bool amxOff : bf16EnginesAmxOff()) {
    lt::kernels::turnOffAmxForTesting(amxOff);
    expectBf16ProductsEqualNaive(amxOff ? "vdpbf16ps" : "AMX");
  }
  lt::kernels::turnOffAmxForTesting(false);
  if (bf16EnginesAmxOff().size() < 2) return;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(16);
  auto q = at::randn({1, 70, 4, 16}, gen), k = at::randn({1, 70, 2, 16}, gen), v = at::randn({1, 70, 2, 16}, gen);
  lt::kernels::FusedAttentionOptions o;
  o.isa = Isa::Avx512Bf16, o.bf16 = true, o.tile = 32;
  const auto amx = lt::kernels::fusedAttention(q, k, v, o);
  lt::kernels::turnOffAmxForTesting(true);
  const auto dot = lt::kernels::fusedAttention(q, k, v, o);
  lt::kernels::turnOffAmxForTesting(false);
  EXPECT_FALSE(at::equal(amx, dot)) << "AMX and vdpbf16ps gave the same bits: one engine ran twice";
  EXPECT_LE(relErr(amx, dot), Tol::kBf16Attention);
}

// Queries at an offset among the keys (a ring step's block: sp/ring_attention.cpp), against a
// dense mask where row s sees keys [start[s], s + offset]: keys wholly earlier, a block that
// meets the diagonal, more and fewer keys than queries, and rows that see no key at all (zero
// output, log-sum-exp -inf, no gradient), for each ISA this CPU runs.
at::Tensor offsetMask(int64_t B, int64_t S, int64_t Sk, int64_t offset, const at::Tensor& start) {
  auto rows = at::arange(S, at::kLong).view({1, S, 1}), cols = at::arange(Sk, at::kLong).view({1, 1, Sk});
  auto hidden = (cols > rows + offset).expand({B, S, Sk});
  return start.defined() ? hidden | (cols < start.unsqueeze(-1)) : hidden;  // [B, S, Sk]
}

// The dense reference's output and log-sum-exp [B, H, S]; a row with no key gets 0 and -inf (one
// column is unmasked for the softmax and its weight zeroed after, so no NaN reaches a gradient).
std::pair<at::Tensor, at::Tensor> offsetReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& hidden) {
  const int64_t H = q.size(2), KV = k.size(2);
  auto kk = k.repeat_interleave(H / KV, 2).transpose(1, 2), vv = v.repeat_interleave(H / KV, 2).transpose(1, 2);
  auto scores = at::matmul(q.transpose(1, 2), kk.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  auto none = hidden.all(-1, true);  // [B, S, 1]
  auto mask = (hidden & ~(none & (at::arange(hidden.size(2)) == 0))).unsqueeze(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  auto seen = (~none).unsqueeze(1).to(q.scalar_type());  // [B, 1, S, 1]
  auto lse = at::logsumexp(scores, -1, true).masked_fill(seen == 0, -std::numeric_limits<float>::infinity());
  return {at::matmul(at::softmax(scores, -1) * seen, vv).transpose(1, 2), lse.squeeze(-1)};
}

struct OffsetCase {
  int64_t B, S, Sk, H, KV, D, tile, offset;
  bool documents;
};

TEST(FusedAttention, QueriesAtAnOffsetEqualADenseMask) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(19);
  const std::vector<OffsetCase> cases = {
      {1, 20, 13, 4, 2, 16, 8, 13, false},  // keys wholly earlier: every key visible
      {2, 19, 23, 4, 1, 8, 4, 5, false},    // a block across the diagonal, more keys than queries
      {1, 10, 30, 2, 2, 16, 64, 0, false},  // the first queries over a longer key run
      {1, 17, 9, 2, 1, 8, 4, -3, false},    // keys start after the first queries: rows 0-2 see none
      {2, 21, 15, 4, 2, 8, 4, 15, true},    // documents: rows 15- start after every key
      {1, 26, 26, 2, 1, 16, 8, 0, true},    // the diagonal block with documents
      // tiles of several 32-row blocks across the diagonal (where the bf16 products skip blocks)
      {1, 150, 170, 4, 2, 16, 128, 20, true}, {1, 140, 100, 2, 1, 32, 64, -30, false},
  };
  for (const auto& c : cases) {
    auto q = at::randn({c.B, c.S, c.H, c.D}, gen), up = at::randn({c.B, c.S, c.H, c.D}, gen);
    auto k = at::randn({c.B, c.Sk, c.KV, c.D}, gen), v = at::randn({c.B, c.Sk, c.KV, c.D}, gen);
    at::Tensor start;
    if (c.documents) {  // documents every 4 (batch row 0) or 5 (row 1) keys; clamped: past every key
      auto rows = at::arange(c.S, at::kLong).unsqueeze(0), every = at::arange(c.B, at::kLong).view({c.B, 1}) + 4;
      start = (at::div(rows, every, "floor") * every).clamp(0, c.Sk);
    }
    const auto hidden = offsetMask(c.B, c.S, c.Sk, c.offset, start);
    auto ref = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& cc) { return offsetReference(a, b, cc, hidden).first; });
    const auto refLse = offsetReference(q, k, v, hidden).second;
    const std::string what = "S" + std::to_string(c.S) + " Sk" + std::to_string(c.Sk) + " offset " +
                             std::to_string(c.offset) + (c.documents ? " documents" : "");
    for (auto isa : supportedIsas()) {
      lt::kernels::FusedAttentionOptions o;
      o.tile = c.tile, o.isa = isa, o.queryOffset = c.offset;
      if (start.defined()) o.documentStart = start;
      auto got = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& cc) { return lt::kernels::fusedAttention(a, b, cc, o); });
      expectClose(got, ref, std::string(lt::kernels::isaName(isa)) + " " + what);
      const auto lse = lt::kernels::fusedAttentionForward(q, k, v, o).lse;
      EXPECT_TRUE(at::equal(at::isinf(lse), at::isinf(refLse))) << what << ": rows with no key";
      auto finite = at::isfinite(refLse);
      EXPECT_LE(relErr(lse.masked_select(finite), refLse.masked_select(finite)), Tol::kFusedKernel) << what << " lse";
    }
    for (bool amxOff : bf16EnginesAmxOff()) {  // bf16 products: within bf16's rounding
      lt::kernels::turnOffAmxForTesting(amxOff);
      lt::kernels::FusedAttentionOptions o;
      o.tile = c.tile, o.isa = Isa::Avx512Bf16, o.bf16 = true, o.queryOffset = c.offset;
      if (start.defined()) o.documentStart = start;
      auto got = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& cc) { return lt::kernels::fusedAttention(a, b, cc, o); });
      const std::vector<std::pair<at::Tensor, at::Tensor>> pairs = {
          {got.out, ref.out}, {got.dq, ref.dq}, {got.dk, ref.dk}, {got.dv, ref.dv}};
      for (const auto& [g, r] : pairs)
        EXPECT_LE(relErr(g, r), Tol::kBf16Attention) << (amxOff ? "vdpbf16ps " : "AMX ") << what;
      const auto lse = lt::kernels::fusedAttentionForward(q, k, v, o).lse;
      EXPECT_TRUE(at::equal(at::isinf(lse), at::isinf(refLse))) << what << ": bf16, rows with no key";
    }
    lt::kernels::turnOffAmxForTesting(false);
  }
}

// The backward's two plans (a task per kv head; a task per key tile, then per query tile) give
// the same bits, in every build this CPU runs (the bf16 one too), with queries at offsets, rows
// that see no key, documents and odd lengths; and the per-tile plan the dense reference's gradients.
TEST(FusedAttention, BackwardPlansGiveTheSameBits) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  const std::vector<OffsetCase> cases = {
      {1, 70, 70, 4, 1, 16, 16, 0, false}, {2, 37, 37, 6, 3, 8, 8, 0, true}, {1, 19, 23, 4, 2, 8, 4, 5, false},
      {1, 17, 9, 2, 1, 8, 4, -3, false},   {2, 21, 15, 4, 2, 8, 4, 15, true}, {1, 40, 40, 2, 1, 32, 0, 0, false},
  };
  std::vector<std::tuple<Isa, bool, bool>> builds;  // ISA, bf16, AMX off
  for (auto isa : supportedIsas()) builds.push_back({isa, false, false});
  for (bool amxOff : bf16EnginesAmxOff()) builds.push_back({Isa::Avx512Bf16, true, amxOff});
  for (const auto& c : cases) {
    auto q = at::randn({c.B, c.S, c.H, c.D}, gen), up = at::randn({c.B, c.S, c.H, c.D}, gen);
    auto k = at::randn({c.B, c.Sk, c.KV, c.D}, gen), v = at::randn({c.B, c.Sk, c.KV, c.D}, gen);
    at::Tensor start;
    if (c.documents) {  // documents every 5 positions, clamped past every key
      auto rows = at::arange(c.S, at::kLong).unsqueeze(0).expand({c.B, c.S});
      start = (at::div(rows, 5, "floor") * 5).clamp(0, c.Sk).contiguous();
    }
    const auto hidden = offsetMask(c.B, c.S, c.Sk, c.offset, start);
    auto ref = runWithGrads(q, k, v, up, [&](auto& a, auto& b, auto& cc) { return offsetReference(a, b, cc, hidden).first; });
    const std::string what = "S" + std::to_string(c.S) + " Sk" + std::to_string(c.Sk) + " KV" + std::to_string(c.KV) +
                             " offset " + std::to_string(c.offset) + (c.documents ? " documents" : "");
    for (auto [isa, bf16, amxOff] : builds) {
      lt::kernels::turnOffAmxForTesting(amxOff);
      lt::kernels::FusedAttentionOptions o;
      o.tile = c.tile, o.isa = isa, o.bf16 = bf16, o.queryOffset = c.offset;
      if (start.defined()) o.documentStart = start;
      const auto fwd = lt::kernels::fusedAttentionForward(q, k, v, o);
      o.backwardPlan = lt::kernels::BackwardPlan::PerKvHead;
      const auto perHead = lt::kernels::fusedAttentionBackward(q, k, v, fwd, up, o);
      o.backwardPlan = lt::kernels::BackwardPlan::PerTile;
      const auto perTile = lt::kernels::fusedAttentionBackward(q, k, v, fwd, up, o);
      const std::string at =
          std::string(lt::kernels::isaName(isa)) + (bf16 ? amxOff ? " bf16 vdpbf16ps " : " bf16 AMX " : " ") + what;
      EXPECT_TRUE(at::equal(perTile.dq, perHead.dq)) << at << " dq";
      EXPECT_TRUE(at::equal(perTile.dk, perHead.dk)) << at << " dk";
      EXPECT_TRUE(at::equal(perTile.dv, perHead.dv)) << at << " dv";
      if (bf16) continue;
      expectClose({fwd.out, perTile.dq, perTile.dk, perTile.dv}, ref, at + " per tile");
    }
  }
  lt::kernels::turnOffAmxForTesting(false);
}

TEST(FusedAttention, BadArgumentsAreNamed) {
  auto q = at::randn({1, 8, 4, 8}), k = at::randn({1, 8, 3, 8});
  EXPECT_NE(lt::testing::errorOf([&] { lt::kernels::fusedAttention(q, k, k); }).find("not a multiple of 3 kv heads"),
            std::string::npos);
  lt::kernels::FusedAttentionOptions o;
  o.documentStart = at::full({1, 8}, 5, at::kLong);  // row 0 cannot start at 5
  auto kv = at::randn({1, 8, 2, 8});
  EXPECT_NE(lt::testing::errorOf([&] { lt::kernels::fusedAttention(q, kv, kv, o); }).find("must lie in [0, s]"),
            std::string::npos);
  o.documentStart = at::tensor(std::vector<int64_t>{0, 1, 0, 0, 0, 0, 0, 0}).view({1, 8});
  EXPECT_NE(lt::testing::errorOf([&] { lt::kernels::fusedAttention(q, kv, kv, o); }).find("non-decreasing"),
            std::string::npos);
  lt::kernels::FusedAttentionOptions bf16;  // bf16 products exist only in the avx512bf16 build
  bf16.bf16 = true;
  bf16.isa = Isa::Baseline;
  EXPECT_NE(lt::testing::errorOf([&] { lt::kernels::fusedAttention(q, kv, kv, bf16); }).find("bf16 products need"),
            std::string::npos);
}

}  // namespace
