// Fused attention: argument checks, the ISA dispatch, the task scheduler and the autograd
// function around the per-ISA kernels (attention_kernels.inc). Non-obvious: work is handed out
// from an atomic counter, largest query tiles first, because causal tiles differ in cost by up to
// S / tile and ATen's parallel_for splits a range into equal contiguous chunks.
#include "longtrain/kernels/fused_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <memory>
#include <cmath>
#include <vector>

#include "longtrain/core/check.h"
#include "longtrain/core/cpu.h"
#include "longtrain/core/trace.h"
#include "longtrain/kernels/attention_kernels.h"
#include "longtrain/kernels/footprint.h"

namespace lt::kernels {

namespace {

using attn_detail::Shape;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The tile edge where none is asked: 256 where a core's L2 holds the backward's two tile-square
// buffers (P, dS: 8 x 256^2 bytes) twice over, else 128. On an Intel Xeon (model 167, 2 MiB L2,
// AVX-512, 2 threads) 256 ran bench/e2e.sh's shapes 2.6-5.1% faster than 128 (long 3-4%, long16k
// 5.1%, medium 3.7%, wide 2.6%; 384 and 512 slower), and 128 was 5-8% faster than 64 and 20%
// faster than 32 before. 128 stays where the L2 is smaller or unknown (unmeasured there).
int64_t defaultTile() {
  static const int64_t tile = l2CacheBytes() >= 2 * 8 * 256 * 256 ? 256 : 128;
  return tile;
}

struct Kernels {
  attn_detail::ForwardTask forward;
  attn_detail::BackwardTask backward;
};

Kernels kernelsFor(Isa isa, bool bf16) {
  LT_CHECK(isaSupported(isa), "fused attention: the ", isaName(isa),
           " kernel was requested but this CPU lacks its instructions; use isaBest()");
  if (bf16) {
    LT_CHECK(isa == Isa::Avx512Bf16,
             "fused attention: bf16 products need the avx512bf16 kernel on a CPU with AVX512_BF16 (asked for ",
             isaName(isa), "); check fusedAttentionBf16Supported() first");
    return {attn_detail::forwardTask_avx512bf16, attn_detail::backwardTask_avx512bf16};
  }
  // The fp32 builds; Avx512Bf16 runs the Avx512 one.
  constexpr Isa kBuilds[] = {Isa::Baseline, Isa::Avx2, Isa::Avx512};
  switch (isaAtMost(isa, std::begin(kBuilds), std::end(kBuilds))) {
    case Isa::Avx512Bf16:
    case Isa::Avx512: return {attn_detail::forwardTask_avx512, attn_detail::backwardTask_avx512};
    case Isa::Avx2: return {attn_detail::forwardTask_avx2, attn_detail::backwardTask_avx2};
    case Isa::Baseline: break;
  }
  return {attn_detail::forwardTask_baseline, attn_detail::backwardTask_baseline};
}

// Runs task(t, scratch) for t in [0, n) on ATen's intra-op threads, each with its own scratch,
// left unset: every task writes what it reads.
template <class Task>
void runTasks(int64_t n, int64_t scratchFloats, const Task& task) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    const std::unique_ptr<float[]> scratch(new float[static_cast<size_t>(scratchFloats)]);
    for (int64_t t; (t = next.fetch_add(1)) < n;) task(t, scratch.get());
  });
}

Shape shapeOf(const at::Tensor& q, const at::Tensor& k, int64_t tile, int64_t offset, bool bf16) {
  Shape s;
  s.B = q.size(0), s.S = q.size(1), s.Sk = k.size(1), s.H = q.size(2), s.KV = k.size(2), s.D = q.size(3);
  s.tile = tile, s.offset = offset, s.bf16 = bf16;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D)));
  return s;
}

// [B, S, KV, D] -> [B, KV, D, S]: rows of K^T (and V^T) become contiguous key runs.
at::Tensor transposed(const at::Tensor& x) { return x.permute({0, 2, 3, 1}).contiguous(); }

// No document mask travels as an empty tensor: autograd functions take no undefined inputs.
const int64_t* startPtr(const at::Tensor& start) { return start.numel() > 0 ? start.data_ptr<int64_t>() : nullptr; }

// What a kernel call needs besides its tensors: the document mask (empty: none), the resolved
// tile, the build to run and where the queries sit among the keys.
struct Launch {
  at::Tensor start;
  int64_t tile = 0;
  Isa isa = Isa::Baseline;
  bool bf16 = false;
  int64_t offset = 0;
  BackwardPlan backwardPlan = BackwardPlan::Auto;
};

FusedAttentionResult runForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Launch& l) {
  trace::Scope scope("kernel", "attention forward");
  at::NoGradGuard ng;
  const Shape s = shapeOf(q, k, l.tile, l.offset, l.bf16);
  FusedAttentionResult r{at::empty_like(q), at::empty({s.B, s.H, s.S}, q.options())};
  auto kt = transposed(k);
  attn_detail::Forward a;
  a.shape = s;
  a.q = q.data_ptr<float>(), a.k = k.data_ptr<float>(), a.v = v.data_ptr<float>(), a.kt = kt.data_ptr<float>();
  a.start = startPtr(l.start);
  a.out = r.out.data_ptr<float>(), a.lse = r.lse.data_ptr<float>();
  const auto kernel = kernelsFor(l.isa, l.bf16).forward;
  const int64_t heads = s.B * s.H, tiles = s.tiles();
  runTasks(heads * tiles, attn_detail::forwardScratch(s), [&](int64_t t, float* scratch) {
    const int64_t bh = t % heads, qTile = tiles - 1 - t / heads;  // largest tiles first
    kernel(a, bh / s.H, bh % s.H, qTile, scratch);
  });
  return r;
}

// The per-tile plan's work over the per-kv-head plan's: two of the five tile products and the
// exp again (bench/attention's backward rows: 83 against 55 ms at 2 kv heads on 2 threads).
constexpr double kPerTileWork = 1.5;

// Per kv head: ceil(units / threads) rounds of a kv head each. Per tile: kPerTileWork times the
// work, spread over every thread. So per tile wins where B x KV leaves threads idle.
BackwardPlan choosePlan(const Shape& s, BackwardPlan asked) {
  if (asked != BackwardPlan::Auto) return asked;
  const int64_t units = s.B * s.KV, threads = std::max(1, at::get_num_threads());
  const double rounds = static_cast<double>((units + threads - 1) / threads);
  return units * kPerTileWork / threads < rounds ? BackwardPlan::PerTile : BackwardPlan::PerKvHead;
}

FusedAttentionGrads runBackward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const FusedAttentionResult& fwd, const at::Tensor& doutIn, const Launch& l) {
  trace::Scope scope("kernel", "attention backward");
  at::NoGradGuard ng;
  const Shape s = shapeOf(q, k, l.tile, l.offset, l.bf16);
  auto dout = doutIn.contiguous();
  FusedAttentionGrads g{at::zeros_like(q), at::empty_like(k), at::empty_like(v)};
  auto kt = transposed(k), vt = transposed(v), delta = at::empty_like(fwd.lse);
  attn_detail::Backward a;
  a.shape = s;
  a.q = q.data_ptr<float>(), a.k = k.data_ptr<float>(), a.v = v.data_ptr<float>();
  a.kt = kt.data_ptr<float>(), a.vt = vt.data_ptr<float>();
  a.out = fwd.out.data_ptr<float>(), a.lse = fwd.lse.data_ptr<float>(), a.dout = dout.data_ptr<float>();
  a.start = startPtr(l.start);
  a.dq = g.dq.data_ptr<float>(), a.dk = g.dk.data_ptr<float>(), a.dv = g.dv.data_ptr<float>();
  a.delta = delta.data_ptr<float>();
  const auto kernel = kernelsFor(l.isa, l.bf16).backward;
  const int64_t scratch = attn_detail::backwardScratch(s), keyTiles = (s.Sk + s.tile - 1) / s.tile;
  using attn_detail::BackwardPart;
  const auto run = [&](BackwardPart part, int64_t heads, int64_t tiles, bool lastTileFirst) {
    runTasks(s.B * heads * tiles, part == BackwardPart::Delta ? 0 : scratch, [&](int64_t t, float* w) {
      const int64_t bh = t % (s.B * heads), tile = lastTileFirst ? tiles - 1 - t / (s.B * heads) : t / (s.B * heads);
      kernel(a, part, bh / heads, bh % heads, tile, w);
    });
  };
  run(BackwardPart::Delta, s.H, 1, false);
  if (choosePlan(s, l.backwardPlan) == BackwardPlan::PerKvHead) {
    run(BackwardPart::KvHead, s.KV, 1, false);
  } else {
    run(BackwardPart::KeyTile, s.KV, keyTiles, false);  // the first key tiles are seen by the most rows
    run(BackwardPart::QueryTile, s.H, s.tiles(), true);
  }
  return g;
}

// No document mask: one empty tensor for every call (an autograd input must be defined).
const at::Tensor& noDocumentMask() {
  static const at::Tensor none = at::empty({0}, at::kLong);
  return none;
}

// A tile longer than the queries and keys is one tile either way: sized by them (rounded up to
// whole cache lines), not by the default or model.attention_chunk, as its scratch is tile^2
// floats a thread. The quick start's 128 tokens take a quarter of a 256 tile's.
int64_t tileFor(int64_t asked, int64_t queries, int64_t keys) {
  const int64_t longest = (std::max(queries, keys) + 15) / 16 * 16;
  return std::min(asked > 0 ? asked : defaultTile(), longest);
}

Launch launchFor(const at::Tensor& q, const at::Tensor& k, const FusedAttentionOptions& options) {
  return {options.documentStart.defined() ? options.documentStart.contiguous() : noDocumentMask(),
          tileFor(options.tile, q.size(1), k.size(1)), options.isa, options.bf16, options.queryOffset,
          options.backwardPlan};
}

struct FusedAttentionFn : torch::autograd::Function<FusedAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& start, int64_t tile, int64_t isa, bool bf16, int64_t offset) {
    auto r = runForward(q, k, v, {start, tile, static_cast<Isa>(isa), bf16, offset});
    ctx->save_for_backward({q, k, v, r.out, r.lse});
    saveOptions(ctx, start, tile, static_cast<Isa>(isa), bf16, offset);
    return r.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto g = runBackward(saved[0], saved[1], saved[2], {saved[3], saved[4]}, grads[0],
                         launchFor(saved[0], saved[1], savedOptions(ctx)));
    return {g.dq, g.dk, g.dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void checkInputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& start,
                 int64_t offset) {
  LT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "fused attention: q, k, v must be [B, S, heads, head_dim]");
  LT_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
           "fused attention: fp32 tensors expected, got ", q.scalar_type());
  const bool selfAttention = offset == 0 && k.size(1) == q.size(1);
  LT_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) > 0 && k.size(3) == q.size(3),
           "fused attention: k and v must be [B, Sk, kv_heads, head_dim] beside q ", q.sizes(), "; got ", k.sizes(),
           " and ", v.sizes());
  LT_CHECK(q.size(2) % k.size(2) == 0, "fused attention: ", q.size(2), " query heads are not a multiple of ",
           k.size(2), " kv heads");
  if (!start.defined()) return;
  LT_CHECK(start.scalar_type() == at::kLong && start.dim() == 2 && start.size(0) == q.size(0) &&
               start.size(1) == q.size(1),
           "fused attention: documentStart must be int64 [B, S] = [", q.size(0), ", ", q.size(1), "]");
  auto rows = at::arange(q.size(1), start.options()).unsqueeze(0);
  const int64_t beyond = selfAttention ? 0 : offset + 1;  // s + offset + 1: the row sees no key of this block
  LT_CHECK(start.ge(0).all().item<bool>() && start.le(rows + beyond).all().item<bool>(),
           "fused attention: documentStart[b, s] must lie in ",
           selfAttention ? "[0, s]" : "[0, s + queryOffset + 1] (queryOffset " + std::to_string(offset) + ")");
  if (q.size(1) > 1)
    LT_CHECK(start.slice(1, 1).ge(start.slice(1, 0, -1)).all().item<bool>(),
             "fused attention: documentStart must be non-decreasing along the sequence (documents are contiguous)");
}

}  // namespace

namespace attn_detail {
int64_t panelFloats(const Shape& s) {
  if (!s.bf16) return s.tile * s.D;  // fp32 packs only right operands: tile x D or D x tile
  const int64_t e = (std::max(s.tile, s.D) + 15) / 16 * 16;
  // >= (e / 2 rounded up to 16 pairs) x e: a tile-square operand's pairs, padded to AMX's 16 x 16.
  // With e = 16k that bound is 256k(k + 1), exactly what AMX's column-read left needs at worst (k
  // odd, head dim = tile): its pack, 8(k + 1) pair rows x e, then B^T's head dim x 8(k + 1) pairs.
  return e * (e + 16);
}

namespace {
std::atomic<bool> amxTurnedOff{false};
}
bool bf16ProductsOnAmx() {
  static const bool amx = cpuIsa().amxBf16 && amxTileStateGranted();  // asked once
  return amx && !amxTurnedOff.load(std::memory_order_relaxed);
}
int64_t forwardScratch(const Shape& s) { return attn_detail::kBand * s.tile + s.tile * s.D + 2 * s.tile + 4 * panelFloats(s); }
int64_t backwardScratch(const Shape& s) {
  return 2 * s.tile * s.tile + 2 * s.tile * s.D + 6 * panelFloats(s);
}
}  // namespace attn_detail

at::Tensor fusedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const FusedAttentionOptions& options) {
  checkInputs(q, k, v, options.documentStart, options.queryOffset);
  const Launch l = launchFor(q, k, options);
  return FusedAttentionFn::apply(q.contiguous(), k.contiguous(), v.contiguous(), l.start, l.tile,
                                 static_cast<int64_t>(l.isa), l.bf16, l.offset);
}

FusedAttentionResult fusedAttentionForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const FusedAttentionOptions& options) {
  checkInputs(q, k, v, options.documentStart, options.queryOffset);
  return runForward(q.contiguous(), k.contiguous(), v.contiguous(), launchFor(q, k, options));
}

FusedAttentionGrads fusedAttentionBackward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const FusedAttentionResult& forward, const at::Tensor& dout,
                                           const FusedAttentionOptions& options) {
  LT_CHECK(forward.out.sizes() == q.sizes() && dout.sizes() == q.sizes() && forward.out.is_contiguous() &&
               forward.lse.is_contiguous() && forward.lse.numel() == q.size(0) * q.size(2) * q.size(1),
           "fused attention backward: out, lse and dout must be fusedAttentionForward's for q ", q.sizes());
  return runBackward(q.contiguous(), k.contiguous(), v.contiguous(), forward, dout, launchFor(q, k, options));
}

void saveOptions(AutogradContext* ctx, const at::Tensor& start, int64_t tile, Isa isa, bool bf16, int64_t offset) {
  ctx->saved_data["start"] = start;
  ctx->saved_data["offset"] = offset;
  ctx->saved_data["tile"] = tile;
  ctx->saved_data["isa"] = static_cast<int64_t>(isa);
  ctx->saved_data["bf16"] = bf16;
}

FusedAttentionOptions savedOptions(AutogradContext* ctx) {
  FusedAttentionOptions o;
  const auto start = ctx->saved_data["start"].toTensor();
  if (start.numel() > 0) o.documentStart = start;
  o.tile = ctx->saved_data["tile"].toInt();
  o.isa = static_cast<Isa>(ctx->saved_data["isa"].toInt());
  o.bf16 = ctx->saved_data["bf16"].toBool();
  o.queryOffset = ctx->saved_data["offset"].toInt();
  return o;
}

bool fusedAttentionBf16Supported() { return isaSupported(Isa::Avx512Bf16); }

bool fusedAttentionBf16OnAmx() { return fusedAttentionBf16Supported() && attn_detail::bf16ProductsOnAmx(); }

const char* fusedAttentionBf16Engine() {
  if (!fusedAttentionBf16Supported()) return "none";
  return fusedAttentionBf16OnAmx() ? "AMX" : "AVX512_BF16";
}

void turnOffAmxForTesting(bool off) { attn_detail::amxTurnedOff = off; }

// Per rank the kernel runs on all S tokens of H/P heads and max(KV/P, 1) kv heads (P = 1: the
// rank's own). It saves the log-sum-exp [B, H/P, S] beside its inputs and output; backward
// allocates dq, dk, dv, the transposes kt, vt and the row terms delta, and each thread its
// scratch for the call (640 KiB at tile 256 and head dim 16 in fp32; ~2.3 MiB in bf16).
Footprint fusedAttentionFootprint(const StepShape& s, bool ownsInputs) {
  Shape k;
  k.tile = tileFor(static_cast<int64_t>(s.attentionChunk), static_cast<int64_t>(s.seq), static_cast<int64_t>(s.seq));
  k.D = static_cast<int64_t>(s.headDim);
  k.bf16 = s.attentionBf16;
  const double perThread = 4.0 * std::max(attn_detail::forwardScratch(k), attn_detail::backwardScratch(k));
  const double q = s.batch * s.seq * (s.heads / s.sp) * s.headDim * 4;
  const double kv = s.batch * s.seq * std::max(s.kvHeads / s.sp, 1.0) * s.headDim * 4;
  Footprint f;
  f.saved.add(1, s.batch * (s.heads / s.sp) * s.seq * 4);
  if (ownsInputs) {
    f.saved.add(2, q);
    f.saved.add(2, kv);
  }
  f.work.add(1, q);
  f.work.add(4, kv);
  f.work.add(1, s.batch * (s.heads / s.sp) * s.seq * 4);  // backward's delta, beside the lse
  f.scratch.add(s.threads, perThread);
  return f;
}

}  // namespace lt::kernels
