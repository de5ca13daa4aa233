// The fused attention kernel's raw interface: one forward tile task and one backward task over
// plain float pointers, compiled once per ISA (attention_kernels.inc) and reached only through
// fused_attention.cpp's run-time dispatch. No libtorch here, so the ISA files build fast.
#pragma once
#include <cstdint>

namespace lt::kernels::attn_detail {

// q, out [B, S, H, D]; k, v [B, Sk, KV, D] (row-major, contiguous); kt, vt [B, KV, D, Sk] (the
// transposes); lse [B, H, S]; start [B, S]: the first key column row s may attend to (its
// document's first token; null: 0, plain causal). Query heads h*KV/H.. share kv head h/(H/KV).
// Row s sits at key position s + offset: it sees key columns [start[s], s + offset]. Causal
// self-attention is Sk = S, offset = 0; a ring step's block of queries over another shard's keys
// has its own (a row that sees no key gets a zero output and a log-sum-exp of -inf).
struct Shape {
  int64_t B = 0, S = 0, Sk = 0, H = 0, KV = 0, D = 0, tile = 64, offset = 0;
  bool bf16 = false;  // the avx512bf16 build's bf16 products (their packs need bigger panels)
  float scale = 1;
  int64_t tiles() const { return (S + tile - 1) / tile; }
};

struct Forward {
  Shape shape;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *kt = nullptr;
  const int64_t* start = nullptr;
  float *out = nullptr, *lse = nullptr;
};

struct Backward {
  Shape shape;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *kt = nullptr, *vt = nullptr;
  const float *out = nullptr, *lse = nullptr, *dout = nullptr;
  const int64_t* start = nullptr;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;  // dq zeroed by the caller; dk, dv written whole
  float* delta = nullptr;                             // [B, H, S]: BackwardPart::Delta's rows
};

// Rows of a band, the unit the tile products skip masked blocks by and the forward runs its
// softmax by (attention_kernels.inc): a forward task's scores are kBand x tile. Whole
// micro-tiles under AVX-512 (16 x 1, 8 x 2); 8 x 1 and 6 + 6 + 4 x 2 else.
constexpr int64_t kBand = 16;

// Floats of scratch one worker needs for each kind of task; and for one packed tile operand
// (fp32, or bf16 pairs), of which a forward task uses 4 and a backward task 6.
int64_t panelFloats(const Shape& s);
int64_t forwardScratch(const Shape& s);
int64_t backwardScratch(const Shape& s);

// One forward task: query tile `qTile` of head h in batch b (out rows and lse written).
using ForwardTask = void (*)(const Forward& a, int64_t b, int64_t h, int64_t qTile, float* scratch);

// The backward runs Delta on every (b, query head) first (it takes no scratch), then one of two
// plans whose tasks touch disjoint memory, so they run in any order on any thread, with the
// same bits:
// - KvHead (`head` a kv head): dq rows of its query heads, dk and dv rows of it, key tile by key
//   tile. B x KV tasks: a thread per kv head.
// - KeyTile (`head` a kv head, `tile` a key tile): its dk and dv rows; then QueryTile (`head` a
//   query head, `tile` a query tile): its dq rows, key tile by key tile in KvHead's order. Many
//   tasks, but the scores and dP are computed twice: for when B x KV leaves threads idle.
enum class BackwardPart { Delta, KvHead, KeyTile, QueryTile };
using BackwardTask = void (*)(const Backward& a, BackwardPart part, int64_t b, int64_t head, int64_t tile,
                              float* scratch);

// The avx512bf16 build's tile products: on AMX tiles (tdpbf16ps) where core/cpu finds AMX-BF16
// granted by the OS, else on vdpbf16ps; the same rounding of every operand, sums in another order.
// fused_attention.cpp owns the choice (a test may turn AMX off); it changes only between calls.
bool bf16ProductsOnAmx();

#define LT_ATTN_DECLARE(isa)                                                                   \
  void forwardTask_##isa(const Forward& a, int64_t b, int64_t h, int64_t qTile, float* scratch); \
  void backwardTask_##isa(const Backward& a, BackwardPart part, int64_t b, int64_t head, int64_t tile, float* scratch);
LT_ATTN_DECLARE(baseline)
LT_ATTN_DECLARE(avx2)
LT_ATTN_DECLARE(avx512)
LT_ATTN_DECLARE(avx512bf16)  // AVX-512 F + AVX512_BF16: tile products on bf16 operands
#undef LT_ATTN_DECLARE

}  // namespace lt::kernels::attn_detail
