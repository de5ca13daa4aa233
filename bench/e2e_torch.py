#!/usr/bin/python3
# bench/e2e_torch.py: the PyTorch peer of bench/e2e.sh, longtrain's Llama (src/longtrain/model) op for op; runs on 1.13
# (naive attention, eager) and 2.x (SDPA, fused AdamW, torch.compile, bf16 autocast: --attention/--fused-adamw/...).
# Non-obvious: every label is scored (Zipf-drawn tokens, S+1 per sample, so the loss must fall from ln(vocab) within
# a few steps), whereas longtrain's kv_recall scores only the query tokens; the cost is the same, since both build the
# full [B, S, vocab] logits and log-softmax every row.
import argparse
import json
import math
import os
import statistics
import sys
import threading
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def num_params_formula(hidden, layers, heads, kv_heads, intermediate, vocab):
    """longtrain's ModelConfig::numParams (untied): blocks + embedding + LM head + final norm."""
    kv_dim = kv_heads * (hidden // heads)
    per_block = 2 * hidden + hidden * hidden * 2 + hidden * kv_dim * 2 + 3 * hidden * intermediate
    return layers * per_block + vocab * hidden * 2 + hidden


def flops_per_token(hidden, layers, heads, kv_heads, intermediate, vocab, seq):
    """6 x (non-embedding params + LM head) + 6 x layers x seq x hidden (causal QK^T and PV, fwd+bwd)."""
    non_embed = num_params_formula(hidden, layers, heads, kv_heads, intermediate, vocab) - 2 * vocab * hidden
    return 6 * (non_embed + vocab * hidden) + 6 * layers * seq * hidden


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(pos, d, theta):
    """cos, sin [B, S, 1, Dh/2] for positions pos [B, S]: once per forward, shared by every block's q and k."""
    half = d // 2
    inv = torch.pow(theta, torch.arange(0, half, dtype=torch.float32) * (-2.0 / d))
    ang = pos.to(torch.float32).unsqueeze(-1) * inv
    return torch.cos(ang).unsqueeze(2), torch.sin(ang).unsqueeze(2)


def rope(x, cos, sin):
    # x [B, S, H, Dh]; half-split layout: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    half = x.size(-1) // 2
    x1, x2 = x.narrow(-1, 0, half), x.narrow(-1, half, half)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def sdpa_attention(q, k, v, gqa_in_place):
    # q [B, S, H, Dh], k/v [B, S, KV, Dh] -> [B, S, H, Dh]. PyTorch 2.6's CPU flash kernel refuses enable_gqa and
    # falls back to the math path ([B, H, S, S] scores): gqa_in_place=False repeats K/V so the flash kernel runs.
    h, kv = q.size(2), k.size(2)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if gqa_in_place:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=kv != h)
    else:
        if kv != h:
            kt, vt = kt.repeat_interleave(h // kv, 1), vt.repeat_interleave(h // kv, 1)
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    return out.transpose(1, 2)


def causal_attention(q, k, v):
    # q [B, S, H, Dh], k/v [B, S, KV, Dh] -> [B, S, H, Dh]; naive, materializes [B, H, S, S].
    h, kv, s, d = q.size(2), k.size(2), q.size(1), q.size(3)
    if kv != h:
        k = k.repeat_interleave(h // kv, 2)
        v = v.repeat_interleave(h // kv, 2)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scores = torch.matmul(qt, kt.transpose(-2, -1)) * (1.0 / math.sqrt(d))
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, -1), vt).transpose(1, 2)


class Llama(torch.nn.Module):
    def __init__(self, a, seed=1234, eps=1e-5, theta=10000.0, std=0.02):
        super().__init__()
        self.a, self.eps, self.theta = a, eps, theta
        d, f = a.hidden, a.intermediate
        kv_dim = a.kv_heads * (a.hidden // a.heads)
        out_std = std / math.sqrt(2.0 * a.layers)
        index = [0]  # longtrain draws each parameter from its own generator, seeded seed * 1000003 + index

        def normal(*shape, s=std):
            gen = torch.Generator().manual_seed(seed * 1000003 + index[0])
            index[0] += 1
            return torch.nn.Parameter(torch.normal(0.0, s, size=shape, generator=gen))

        def ones(n):
            index[0] += 1
            return torch.nn.Parameter(torch.ones(n))

        self.embed = normal(a.vocab, d)
        self.blocks = torch.nn.ModuleList()
        for _ in range(a.layers):
            b = torch.nn.Module()
            b.attn_norm, b.wq, b.wk, b.wv = ones(d), normal(d, d), normal(kv_dim, d), normal(kv_dim, d)
            b.wo = normal(d, d, s=out_std)
            b.mlp_norm, b.w_gate, b.w_up = ones(d), normal(f, d), normal(f, d)
            b.w_down = normal(d, f, s=out_std)
            self.blocks.append(b)
        self.final_norm = ones(d)
        self.lm_head = normal(a.vocab, d)

    def attention(self, q, k, v):
        if self.a.attention == "naive":
            return causal_attention(q, k, v)
        return sdpa_attention(q, k, v, self.a.attention == "sdpa_gqa")

    def block(self, b, x, cos, sin):
        a = self.a
        B, S = x.size(0), x.size(1)
        H, KV, Dh = a.heads, a.kv_heads, a.hidden // a.heads
        h = rms_norm(x, b.attn_norm, self.eps)
        q = rope(F.linear(h, b.wq).view(B, S, H, Dh), cos, sin)
        k = rope(F.linear(h, b.wk).view(B, S, KV, Dh), cos, sin)
        v = F.linear(h, b.wv).view(B, S, KV, Dh)
        x1 = x + F.linear(self.attention(q, k, v).reshape(B, S, H * Dh), b.wo)
        m = rms_norm(x1, b.mlp_norm, self.eps)
        return x1 + F.linear(F.silu(F.linear(m, b.w_gate)) * F.linear(m, b.w_up), b.w_down)

    def hidden_states(self, ids, pos):
        x = F.embedding(ids, self.embed)
        cos, sin = rope_tables(pos, self.a.hidden // self.a.heads, self.theta)
        for b in self.blocks:
            if self.a.checkpoint:
                x = checkpoint(self.block, b, x, cos, sin, use_reentrant=False)
            else:
                x = self.block(b, x, cos, sin)
        return rms_norm(x, self.final_norm, self.eps)

    def forward(self, ids, pos):
        return F.linear(self.hidden_states(ids, pos), self.lm_head)

    def head_loss_sum(self, h, labels):
        logits = F.linear(h, self.lm_head).float()
        return F.cross_entropy(logits.reshape(-1, self.a.vocab), labels.reshape(-1), reduction="sum")

    def loss(self, ids, pos, labels):
        """Mean cross-entropy over every label, in fp32 even under bf16 autocast (as longtrain's loss). With
        --loss-chunk N the head and loss run N tokens at a time, each chunk recomputed in backward (not stock
        PyTorch: what longtrain's model.loss_chunk does), so [B, S, vocab] logits never exist whole."""
        if not self.a.loss_chunk:
            return self.head_loss_sum(self.hidden_states(ids, pos), labels) / labels.numel()
        h, n = self.hidden_states(ids, pos), self.a.loss_chunk
        total = sum(checkpoint(self.head_loss_sum, h[:, i:i + n], labels[:, i:i + n], use_reentrant=False)
                    for i in range(0, h.size(1), n))
        return total / labels.numel()


def gemm_peak(threads, dtype_name, n):
    """Best of 5 n^3 matmuls in fp32 or bf16, in FLOP/s."""
    torch.set_num_threads(threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.matmul(a, b)  # warm-up: thread pool, page faults
    best = min(_timed(lambda: torch.matmul(a, b)) for _ in range(5))
    print(json.dumps({"gemm_peak_flops": 2.0 * n ** 3 / best, "n": n, "threads": threads, "dtype": dtype_name,
                      "torch": torch.__version__}))


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    for name, default in [("hidden", 64), ("layers", 2), ("heads", 4), ("kv-heads", 2), ("intermediate", 192),
                          ("vocab", 128), ("seq", 128), ("batch", 32), ("steps", 10), ("warmup", 2), ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint around each block")
    p.add_argument("--attention", choices=["naive", "sdpa", "sdpa_gqa"], default="naive",
                   help="naive composition (1.13); SDPA with K/V repeated to the query heads; SDPA with enable_gqa")
    p.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True) (PyTorch >= 2.4)")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward and loss (PyTorch >= 2.0)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast around forward and loss")
    p.add_argument("--budget-s", type=float, default=0,
                   help="stop early once 3 steps after warm-up ran and the timed steps took this long (0: all steps)")
    p.add_argument("--loss-chunk", type=int, default=0,
                   help="head and loss N tokens at a time, each chunk recomputed in backward (0: whole logits)")
    p.add_argument("--rss-cap-mib", type=float, default=0,
                   help="exit 3 as soon as resident memory passes this (a watchdog for bench/max_seq_peer.sh's search)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--gemm-peak", choices=["fp32", "bf16"], help="only measure the GEMM peak of this type and exit")
    p.add_argument("--gemm-n", type=int, default=2048, help="matrix size for --gemm-peak")
    a = p.parse_args()
    major = int(torch.__version__.split(".")[0])
    if major < 2 and (a.attention != "naive" or a.compile or a.fused_adamw):
        p.error(f"--attention {a.attention} / --compile / --fused-adamw need PyTorch 2.x, this is {torch.__version__}")
    return a


def status_kib(field):
    """VmRSS / VmHWM of this process from /proc/self/status, in KiB."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def rss_watchdog(cap_mib):
    """Polls VmHWM every 10 ms; past the cap the run cannot fit its budget, so it stops before using more."""
    while True:
        hwm = status_kib("VmHWM")
        if hwm > cap_mib * 1024:
            print(json.dumps({"over_cap": True, "peak_rss_bytes": hwm * 1024, "cap_mib": cap_mib}), flush=True)
            os._exit(3)
        time.sleep(0.01)


def zipf_tokens(a):
    """[steps, batch, seq + 1] tokens drawn with p(i) ~ 1 / (i + 1): learnable, so the loss falls at once."""
    g = torch.Generator().manual_seed(a.seed + 1)
    p = 1.0 / torch.arange(1, a.vocab + 1, dtype=torch.float64)
    n = a.steps * a.batch * (a.seq + 1)
    return torch.multinomial(p, n, replacement=True, generator=g).view(a.steps, a.batch, a.seq + 1)


def train(a, model):
    """Runs a.steps steps; returns per-step seconds and losses (the sync of .item() is outside the clock)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, **({"fused": True} if a.fused_adamw else {}))
    loss_fn = torch.compile(model.loss) if a.compile else model.loss
    data = zipf_tokens(a)
    pos = torch.arange(a.seq).unsqueeze(0).expand(a.batch, a.seq)
    times, losses = [], []
    for step in range(a.steps):
        ids, labels = data[step, :, :-1], data[step, :, 1:]
        t = time.perf_counter()
        if a.bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(ids, pos, labels)
        else:
            loss = loss_fn(ids, pos, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
        timed = times[a.warmup:]
        if a.budget_s and len(timed) >= 3 and sum(timed) >= a.budget_s:
            break
    return times, losses


def check(a, losses):
    """The run's own result: finite, starting near ln(vocab), falling. Returns an error line or None."""
    ln_v = math.log(a.vocab)
    if not all(math.isfinite(x) for x in losses):
        return f"non-finite loss {losses}"
    if abs(losses[0] - ln_v) > 0.1 * ln_v:
        return f"first loss {losses[0]:.4f} not within 10% of ln(vocab) = {ln_v:.4f}"
    if not losses[-1] < losses[0]:
        return f"loss did not fall: {losses[0]:.4f} -> {losses[-1]:.4f}"
    return None


def main():
    a = parse_args()
    if a.gemm_peak:
        gemm_peak(a.threads, a.gemm_peak, a.gemm_n)
        return 0
    if a.warmup >= a.steps:
        sys.exit(f"--warmup={a.warmup} must be below --steps={a.steps}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if a.rss_cap_mib:
        threading.Thread(target=rss_watchdog, args=(a.rss_cap_mib,), daemon=True).start()

    model = Llama(a, seed=a.seed)
    n_params = sum(t.numel() for t in model.parameters())
    expect = num_params_formula(a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab)
    if n_params != expect:
        sys.exit(f"parameter count {n_params} != longtrain's ModelConfig::numParams {expect}")
    times, losses = train(a, model)

    med = statistics.median(times[a.warmup:])
    out = {"median_step_s": med, "tokens_per_s": a.batch * a.seq / med, "first_loss": losses[0],
           "last_loss": losses[-1], "threads": torch.get_num_threads(), "params": n_params,
           "flops_per_token": flops_per_token(a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab,
                                              a.seq),
           "torch": torch.__version__, "attention": a.attention, "fused_adamw": a.fused_adamw,
           "compile": a.compile, "bf16": a.bf16, "first_step_s": times[0],
           "checkpoint": a.checkpoint, "steps": len(times), "warmup": a.warmup, "seq": a.seq,
           "loss_chunk": a.loss_chunk, "peak_rss_bytes": status_kib("VmHWM") * 1024}
    print(json.dumps(out))
    err = check(a, losses)
    if err:
        print(f"e2e_torch: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
