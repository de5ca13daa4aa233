#!/usr/bin/env bash
# bench/alst_ablation.sh: the ALST ablation. For a fixed per-rank budget, `longtrain plan
# --max-seq` predicts the longest seq_len of each rung (1 baseline: naive attention, whole
# logits, plain MLP, SP = 1; 2 + tiled logits-loss; 3 + chunked attention; 4 + tiled MLP;
# 5 + SP = 2; 6 + SP = 4; 7 + ZeRO-3 with SuperOffload), then each rung trains 2 steps at that
# length: measured peak RSS (max over ranks and steps) against the budget, and tokens/s of
# step 2. Rungs up to CHECK_UP_TO (default 5) also train at 1.1x the length, which should not
# fit. Model: bench/alst_ablation.json (2 layers, hidden 64, vocab 16384, kv_recall).
# Every rank runs THREADS (default 1) intra-op threads, so rungs 1-4 use 1 core, rung 5 both
# cores, rungs 6-7 oversubscribe 2 cores with 4 ranks (tokens/s is per run, not per core).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longtrain}
CFG=${CFG:-bench/alst_ablation.json}
BUDGET=${BUDGET:-320MiB}
CHECK_UP_TO=${CHECK_UP_TO:-5}
THREADS=${THREADS:-1}
out=$(mktemp -d)
$BIN plan "$CFG" --max-seq "$BUDGET" | tee "$out/plan.txt" >&2
python3 - "$BIN" "$CFG" "$BUDGET" "$CHECK_UP_TO" "$out" "$THREADS" <<'PY'
import json, re, subprocess, sys
binary, cfg, budget_s, check_up_to, out, threads = sys.argv[1:7]
budget = None
rungs = []
for line in open(f"{out}/plan.txt"):
    m = re.match(r"budget ([\d.]+) MiB", line)
    if m: budget = float(m.group(1))
    m = re.match(r"  (\d) (.+?)\s+(\d+)\s+(\d+)\s+(\S+)\s+(model\..*)$", line)
    if m: rungs.append((int(m.group(1)), m.group(2).strip(), int(m.group(3)), int(m.group(4)), m.group(5), m.group(6).split()))

def train(ranks, seq, opts, tag):
    args = [binary, "train", cfg, "--nproc", str(ranks), "--set", f"data.seq_len={seq}", "--set", "train.steps=2", "--set", f"train.threads={threads}",
            # the budget the plan chose activation checkpointing for, not the host's default
            "--set", f"train.memory_budget={budget_s}", "--metrics", f"{out}/{tag}.jsonl"]
    for o in opts: args += ["--set", o]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        return None, None, r.stdout.strip().splitlines()[-1]
    rows = [json.loads(l) for l in open(f"{out}/{tag}.jsonl")]
    return max(x["peak_rss_bytes"] for x in rows) / 2**20, rows[-1]["tokens_per_s"], ""

print(f"budget {budget:.0f} MiB per rank")
print("| rung | ranks | longest seq_len (plan) | x baseline | predicted peak MiB | measured peak MiB | fits | tokens/s | 1.1x length: measured MiB |")
print("|---|---|---|---|---|---|---|---|---|")
base = None
for num, name, ranks, seq, pred, opts in rungs:
    peak, tps, err = train(ranks, seq, opts, f"r{num}")
    base = base or seq
    over = "-"
    if num <= int(check_up_to) and peak is not None:
        seq11 = int(seq * 1.1) // ranks * ranks
        p11, _, e11 = train(ranks, seq11, opts, f"r{num}x")
        over = f"{p11:.0f} at {seq11} ({'over' if p11 > budget else 'still fits'})" if p11 else f"failed: {e11}"
    if peak is None:
        print(f"| {num} {name} | {ranks} | {seq} | {seq / base:.1f} | {pred} | failed: {err} | - | - | {over} |")
    else:
        print(f"| {num} {name} | {ranks} | {seq} | {seq / base:.1f} | {pred} | {peak:.0f} | {'yes' if peak <= budget else 'NO'} | {tps:.0f} | {over} |")
    sys.stdout.flush()
PY
