#!/usr/bin/python3
# bench/e2e_torch.py: the PyTorch-eager baseline of bench/e2e.sh, longtrain's Llama (src/longtrain/model) op for op.
# Non-obvious: every label is scored (random tokens, S+1 per sample), whereas longtrain's kv_recall scores only the
# query tokens; the cost is the same, since both build the full [B, S, vocab] logits and log-softmax every row.
import argparse
import json
import math
import statistics
import sys
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


def rope(x, pos, theta):
    # x [B, S, H, Dh], pos [B, S]; half-split layout: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    d = x.size(-1)
    half = d // 2
    inv = torch.pow(theta, torch.arange(0, half, dtype=x.dtype) * (-2.0 / d))
    ang = pos.to(x.dtype).unsqueeze(-1) * inv
    cos, sin = torch.cos(ang).unsqueeze(2), torch.sin(ang).unsqueeze(2)
    x1, x2 = x.narrow(-1, 0, half), x.narrow(-1, half, half)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


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

    def block(self, b, x, pos):
        a = self.a
        B, S = x.size(0), x.size(1)
        H, KV, Dh = a.heads, a.kv_heads, a.hidden // a.heads
        h = rms_norm(x, b.attn_norm, self.eps)
        q = rope(F.linear(h, b.wq).view(B, S, H, Dh), pos, self.theta)
        k = rope(F.linear(h, b.wk).view(B, S, KV, Dh), pos, self.theta)
        v = F.linear(h, b.wv).view(B, S, KV, Dh)
        x1 = x + F.linear(causal_attention(q, k, v).reshape(B, S, H * Dh), b.wo)
        m = rms_norm(x1, b.mlp_norm, self.eps)
        return x1 + F.linear(F.silu(F.linear(m, b.w_gate)) * F.linear(m, b.w_up), b.w_down)

    def forward(self, ids, pos):
        x = F.embedding(ids, self.embed)
        for b in self.blocks:
            if self.a.checkpoint:
                x = checkpoint(self.block, b, x, pos, use_reentrant=False)
            else:
                x = self.block(b, x, pos)
        return F.linear(rms_norm(x, self.final_norm, self.eps), self.lm_head)


def gemm_peak(threads):
    """Best of 5 fp32 2048^3 matmuls, in FLOP/s."""
    torch.set_num_threads(threads)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)  # warm-up: thread pool, page faults
    best = min(_timed(lambda: torch.matmul(a, b)) for _ in range(5))
    print(json.dumps({"gemm_peak_flops": 2.0 * n ** 3 / best, "n": n, "threads": threads}))


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser(description=__doc__)
    for name, default in [("hidden", 64), ("layers", 2), ("heads", 4), ("kv-heads", 2), ("intermediate", 192),
                          ("vocab", 128), ("seq", 128), ("batch", 32), ("steps", 10), ("warmup", 2), ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint around each block")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--gemm-peak", action="store_true", help="only measure the sgemm peak and exit")
    a = p.parse_args()
    if a.gemm_peak:
        gemm_peak(a.threads)
        return 0
    if a.warmup >= a.steps:
        sys.exit(f"--warmup={a.warmup} must be below --steps={a.steps}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    model = Llama(a, seed=a.seed)
    n_params = sum(t.numel() for t in model.parameters())
    expect = num_params_formula(a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab)
    if n_params != expect:
        sys.exit(f"parameter count {n_params} != longtrain's ModelConfig::numParams {expect}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    g = torch.Generator().manual_seed(a.seed + 1)
    data = torch.randint(0, a.vocab, (a.steps, a.batch, a.seq + 1), generator=g)
    pos = torch.arange(a.seq).unsqueeze(0).expand(a.batch, a.seq)

    times, losses = [], []
    for step in range(a.steps):
        ids, labels = data[step, :, :-1], data[step, :, 1:]
        t = time.perf_counter()
        logits = model(ids, pos)
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), labels.reshape(-1), reduction="sum") / labels.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
        losses.append(loss.item())  # after the clock: the sync is not part of the step

    med = statistics.median(times[a.warmup:])
    out = {"median_step_s": med, "tokens_per_s": a.batch * a.seq / med, "first_loss": losses[0],
           "last_loss": losses[-1], "threads": torch.get_num_threads(), "params": n_params,
           "flops_per_token": flops_per_token(a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab,
                                              a.seq),
           "checkpoint": a.checkpoint, "steps": a.steps, "warmup": a.warmup}
    print(json.dumps(out))
    ln_v = math.log(a.vocab)
    if not all(math.isfinite(x) for x in losses):
        print(f"e2e_torch: non-finite loss {losses}", file=sys.stderr)
        return 1
    if abs(losses[0] - ln_v) > 0.1 * ln_v:
        print(f"e2e_torch: first loss {losses[0]:.4f} not within 10% of ln(vocab) = {ln_v:.4f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
