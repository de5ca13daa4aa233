#!/usr/bin/python3
# bench/max_seq_peer.py: bench/max_seq_peer.sh's driver. Per budget: longtrain's `plan --max-seq` length, trained 2
# steps to measure its peak RSS; and the PyTorch 2.6 peer's (bench/e2e_torch.py) longest length found by search.
# Non-obvious: the peer's memory is linear in seq_len (SDPA's flash kernel, per-block recompute, [S, vocab] logits),
# so each candidate is the line through the two measured points nearest the budget, then gallops and bisects to
# STEP; a watchdog in the peer stops a candidate the moment VmHWM passes the budget, so one that does not fit costs
# seconds and never takes more than the budget of the shared machine's memory.
import argparse
import glob
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"  # the same path on the host and in the Debian 13 root


def mib(text):
    """'2GiB' / '512MiB' / '1.5GiB' -> MiB."""
    m = re.fullmatch(r"([\d.]+)\s*(GiB|MiB)", text)
    if not m:
        sys.exit(f"max_seq_peer: budget '{text}' is not N GiB or N MiB")
    return float(m.group(1)) * (1024 if m.group(2) == "GiB" else 1)


def read_config(path):
    return json.loads("\n".join(l for l in open(path) if not re.match(r"\s*//", l)))


def run(cmd, log, timeout_s):
    """Runs cmd in its own session (a timeout kills the Debian root's unshare and all below it); (rc, out, s)."""
    t = time.time()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=f, text=True, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return None, "", time.time() - t
    with open(log, "a") as f:
        f.write(out)
    return p.returncode, out, time.time() - t


def check_losses(who, losses, vocab):
    ln_v = math.log(vocab)
    if not losses or not all(math.isfinite(x) for x in losses) or abs(losses[0] - ln_v) > 0.1 * ln_v:
        sys.exit(f"max_seq_peer: {who}: losses {losses} fail the checks (finite, first within 10% of ln(vocab) "
                 f"= {ln_v:.4f})")


class Longtrain:
    def __init__(self, a):
        self.a = a

    def plan(self, budget):
        out = subprocess.run([self.a.bin, "plan", self.a.config, "--max-seq", budget], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        m = re.search(r"this config: longest seq_len (\d+) \(predicted peak (\d+) MiB\)", out)
        p = re.search(r"^plan: ([\d.]+)M params", out, re.M)
        if not m or not p:
            sys.exit(f"max_seq_peer: cannot read `longtrain plan --max-seq {budget}`:\n{out}")
        return int(m.group(1)), float(m.group(2)), float(p.group(1))

    def train(self, seq, budget, tag):
        """2 steps at seq with the plan's budget; returns peak RSS MiB (max over steps), step s, recompute line."""
        metrics = f"{self.a.out}/{tag}.jsonl"
        cmd = [self.a.bin, "train", self.a.config, "--set", f"data.seq_len={seq}", "--set", "train.steps=2",
               "--set", f"train.memory_budget={budget}", "--metrics", metrics]
        if self.a.reuse and os.path.exists(metrics) and len(open(metrics).readlines()) == 2:
            rc, secs = 0, 0.0  # REUSE=1: this budget's run is already in OUT
        else:
            rc, _, secs = run(cmd, f"{self.a.out}/{tag}.log", self.a.timeout_s)
        if rc is None:
            return {"timeout": secs}
        log = open(f"{self.a.out}/{tag}.log").read()
        if rc != 0:
            sys.exit(f"max_seq_peer: longtrain at {seq} failed (rc {rc}):\n{log[-2000:]}")
        rows = [json.loads(l) for l in open(metrics)]
        check_losses(f"longtrain at {seq}", [r["loss"] for r in rows], self.a.vocab)
        ac = re.search(r'activation_checkpointing "\w+": (.*?) \(', log)
        return {"peak": max(r["peak_rss_bytes"] for r in rows) / 2**20, "step_s": rows[-1].get("step_time_s"),
                "secs": secs, "recompute": ac.group(1) if ac else "?", "losses": [r["loss"] for r in rows]}


class Peer:
    """The PyTorch 2.6 peer in the Debian 13 root: SDPA (K/V repeated: the flash kernel), per-block checkpoint,
    fused AdamW, fp32; variant 'chunked' adds a head + loss in LOSS_CHUNK-token tiles, recomputed per tile."""

    def __init__(self, a, variant):
        self.a, self.variant = a, variant
        self.seen = {}  # seq -> {"peak": MiB, "complete": bool} (a stopped run's peak is a lower bound)
        for log in glob.glob(f"{a.out}/peer_{variant}_*.log") if a.reuse else []:
            done = [l for l in open(log) if l.startswith('{"')]
            if done:
                j, seq = json.loads(done[-1]), int(re.search(r"_(\d+)\.log$", log).group(1))
                self.seen[seq] = {"peak": j["peak_rss_bytes"] / 2**20, "complete": not j.get("over_cap"), "secs": 0,
                                  "params": j.get("params"), "step_s": j.get("median_step_s")}

    def measure(self, seq, cap_mib):
        if seq in self.seen and (self.seen[seq]["complete"] or self.seen[seq]["peak"] > cap_mib):
            return self.seen[seq]
        m, a = self.a.model, self.a
        env = ["env"] + ([f"LD_PRELOAD={TCMALLOC}"] if a.alloc == "tcmalloc" else [])
        cmd = ["bash", "scripts/debian13_root.sh", "--python-torch", "--bind", os.getcwd(), "--", *env,
               "python3", "bench/e2e_torch.py", "--hidden", str(m["hidden_size"]), "--layers", str(m["num_layers"]),
               "--heads", str(m["num_heads"]), "--kv-heads", str(m.get("num_kv_heads", m["num_heads"])),
               "--intermediate", str(m["intermediate_size"]), "--vocab", str(m["vocab_size"]), "--seq", str(seq),
               "--batch", "1", "--steps", "2", "--warmup", "1", "--threads", str(a.threads), "--checkpoint",
               "--attention", "sdpa", "--fused-adamw", "--rss-cap-mib", str(cap_mib)]
        if self.variant == "chunked":
            cmd += ["--loss-chunk", str(a.loss_chunk)]
        tag = f"peer_{self.variant}_{seq}"
        log = f"{a.out}/{tag}.log"
        done = a.reuse and os.path.exists(log) and [l for l in open(log) if l.startswith('{"')]
        if done and (json.loads(done[-1]).get("over_cap") is None or json.loads(done[-1])["peak_rss_bytes"] > cap_mib * 2**20):
            rc, out, secs = (3 if json.loads(done[-1]).get("over_cap") else 0), done[-1], 0.0  # REUSE=1
        else:
            rc, out, secs = run(cmd, log, a.timeout_s)
        if rc is None:
            r = {"timeout": True, "secs": secs, "complete": False, "peak": 0}
        else:
            line = next((l for l in out.splitlines() if l.startswith("{")), None)
            if line is None:
                sys.exit(f"max_seq_peer: peer {self.variant} at {seq} failed (rc {rc}): see {a.out}/{tag}.log")
            j = json.loads(line)
            if j.get("over_cap"):
                r = {"peak": j["peak_rss_bytes"] / 2**20, "complete": False, "secs": secs}
            else:
                if rc != 0:
                    sys.exit(f"max_seq_peer: peer {self.variant} at {seq} failed its checks: see {a.out}/{tag}.log")
                check_losses(f"peer {self.variant} at {seq}", [j["first_loss"], j["last_loss"]], a.vocab)
                r = {"peak": j["peak_rss_bytes"] / 2**20, "complete": True, "secs": secs, "params": j["params"],
                     "step_s": j["median_step_s"], "losses": [j["first_loss"], j["last_loss"]]}
        self.seen[seq] = r
        print(f"  peer {self.variant} seq {seq}: "
              + ("timeout" if r.get("timeout") else f"peak {r['peak']:.0f} MiB{'' if r['complete'] else '+ (stopped)'}")
              + f", {secs:.0f} s", file=sys.stderr, flush=True)
        return r

    def line_through(self, budget_mib):
        """seq where the line through the two complete points nearest the budget reaches it; None with < 2."""
        pts = sorted((abs(r["peak"] - budget_mib), s, r["peak"]) for s, r in self.seen.items() if r["complete"])
        if len(pts) < 2:
            return None
        (_, s1, p1), (_, s2, p2) = pts[:2]
        if p1 == p2:
            return None
        return s1 + (budget_mib - p1) * (s2 - s1) / (p2 - p1)

    def search(self, budget_mib):
        """Longest multiple of STEP whose 2 steps peak within the budget; or the line's estimate if past MAX_SEQ."""
        step = self.a.step
        for s in self.a.probe:  # two short lengths for the first line (cheap; shared by every budget)
            self.measure(s, budget_mib)
        lo = max([s for s, r in self.seen.items() if r["complete"] and r["peak"] <= budget_mib], default=0)
        hi = min([s for s, r in self.seen.items() if r["peak"] > budget_mib], default=None)
        est = self.line_through(budget_mib)
        if est is not None and est > self.a.peer_max_seq:
            return {"seq": None, "estimate": est, "lo": lo}
        for _ in range(self.a.max_runs):
            if hi is not None and hi - lo <= step:
                break
            est = self.line_through(budget_mib)
            cand = int(est // step * step) if est else 2 * max(lo, step)
            if cand <= lo:
                cand = lo + step
            if hi is not None and cand >= hi:
                cand = max(hi - step, (lo + hi) // 2 // step * step)
            if cand > self.a.peer_max_seq:
                return {"seq": None, "estimate": est, "lo": lo}
            r = self.measure(cand, budget_mib)
            if r.get("timeout"):
                return {"seq": None, "estimate": est, "lo": lo, "timeout": cand}
            if r["complete"] and r["peak"] <= budget_mib:
                lo = cand
            else:
                hi = cand
        if lo == 0:
            return {"seq": 0, "lo": 0}
        return {"seq": lo, "peak": self.seen[lo]["peak"], "params": self.seen[lo]["params"],
                "step_s": self.seen[lo]["step_s"], "over": (hi, self.seen[hi]["peak"]) if hi else None}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bin", default="./build/longtrain")
    p.add_argument("--config", default="bench/max_seq_peer.json")
    p.add_argument("--budgets", default="768MiB 1GiB 2GiB 4GiB 8GiB")
    p.add_argument("--variants", default="plain chunked", help="peer variants: plain (whole logits), chunked")
    p.add_argument("--step", type=int, default=256, help="the peer's lengths are multiples of this")
    p.add_argument("--probe", default="1024 2048", help="the peer's first two lengths (the first line)")
    p.add_argument("--lt-max-seq", type=int, default=30000, help="longtrain trains only plan lengths up to this")
    p.add_argument("--peer-max-seq", type=int, default=24576, help="the peer runs only lengths up to this")
    p.add_argument("--loss-chunk", type=int, default=256, help="the chunked peer's tile (longtrain's loss_chunk)")
    p.add_argument("--alloc", choices=["tcmalloc", "glibc"], default="tcmalloc", help="the peer's allocator")
    p.add_argument("--max-runs", type=int, default=8, help="the peer's runs per budget after the probes")
    p.add_argument("--timeout-s", type=float, default=1800, help="per run")
    p.add_argument("--reuse", action="store_true", help="take the runs already in --out (a search cut short)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    cfg = read_config(a.config)
    a.model, a.vocab, a.threads = cfg["model"], cfg["model"]["vocab_size"], cfg["train"].get("threads", 2)
    a.probe = [int(x) for x in a.probe.split()]
    lt = Longtrain(a)
    peers = {v: Peer(a, v) for v in a.variants.split()}
    rows = []
    for budget in a.budgets.split():
        b = mib(budget)
        seq, pred, params_m = lt.plan(budget)
        print(f"## {budget}: longtrain plan {seq} tokens, predicted {pred:.0f} MiB", file=sys.stderr, flush=True)
        ltr = lt.train(seq, budget, f"lt_{budget}") if seq <= a.lt_max_seq else None
        row = {"budget": budget, "budget_mib": b, "lt_seq": seq, "lt_pred": pred, "lt": ltr, "peer": {}}
        if ltr and "peak" in ltr:
            print(f"  longtrain {seq}: peak {ltr['peak']:.1f} MiB ({ltr['recompute']}), {ltr['secs']:.0f} s",
                  file=sys.stderr, flush=True)
        if ltr and "peak" in ltr and ltr["peak"] > b:
            # Over: plan again for the budget less the measured excess, and measure that length (what a user
            # would do next); the ratio then uses a length that was seen to fit.
            less = f"{b - (ltr['peak'] - pred):.0f}MiB"
            fseq, fpred, _ = lt.plan(less)
            fit = lt.train(fseq, less, f"lt_{budget}_fit") if 0 < fseq <= a.lt_max_seq else None
            row["lt_fit"] = {"budget": less, "seq": fseq, "pred": fpred, **(fit or {})}
            if fit and "peak" in fit:
                print(f"  longtrain {fseq} (plan for {less}): peak {fit['peak']:.1f} MiB", file=sys.stderr, flush=True)
        for v, peer in peers.items():
            r = peer.search(b)
            if r.get("params") and abs(r["params"] - params_m * 1e6) > 0.005e6 + 1:
                sys.exit(f"max_seq_peer: longtrain has {params_m}M params, the peer {r['params']}")
            row["peer"][v] = r
        rows.append(row)
        json.dump(rows, open(f"{a.out}/rows.json", "w"), indent=1)
    table(rows, a)


def table(rows, a):
    variants = a.variants.split()
    head = "| budget | longtrain seq_len (plan) | predicted MiB | measured MiB | longtrain seq_len seen to fit |"
    for v in variants:
        head += f" PyTorch 2.6 {v} seq_len | measured MiB | longtrain x {v} |"
    print(head)
    print("|" + "---|" * (5 + 3 * len(variants)))
    for r in rows:
        lt, fit, b = r["lt"], r.get("lt_fit"), r["budget_mib"]
        fits = None  # the longest longtrain length measured within the budget
        if lt is None:
            meas = f"not run (> {a.lt_max_seq} tokens)"
        elif "timeout" in lt:
            meas = f"timeout ({lt['timeout']:.0f} s)"
        else:
            over = f"OVER by {100 * (lt['peak'] / b - 1):.1f}%"
            meas = f"{lt['peak']:.0f} ({'within' if lt['peak'] <= b else over})"
            fits = r["lt_seq"] if lt["peak"] <= b else None
        if fit and "peak" in fit:
            seen = f"{fit['seq']:,} (plan for {fit['budget']}: {fit['pred']:.0f} predicted, {fit['peak']:.0f} measured)"
            fits = fit["seq"] if fit["peak"] <= b else None
            seen = seen if fits else "none seen: " + seen
        else:
            seen = f"{fits:,}" if fits else "-"
        line = f"| {r['budget']} | {r['lt_seq']:,} | {r['lt_pred']:.0f} | {meas} | {seen} |"
        for v in variants:
            pr = r["peer"][v]
            # the plan's length where longtrain was not run; none where its runs were all over the budget
            ref, mark = (fits, "") if fits else (None if lt else r["lt_seq"], "~")
            ratio = lambda n, m: f"{m}{ref / n:.1f}x" if ref else "-"
            if pr.get("seq"):
                line += f" {pr['seq']:,} | {pr['peak']:.0f} | {ratio(pr['seq'], mark)} |"
            elif pr.get("seq") == 0:
                line += " none fits | - | - |"
            else:
                est = pr.get("estimate")
                line += f" ~{est:,.0f} (line, not run) | - | {ratio(est, '~')} |" if est else " ? | - | - |"
        print(line)

if __name__ == "__main__":
    main()
