#!/usr/bin/env bash
# bench/activation_offload.sh: activation offload to disk (train.offload_dir). For each per-rank
# budget in BUDGETS, `longtrain plan --max-seq` predicts the longest seq_len without and with
# offload; each is then trained STEPS (2) steps at that length with train.memory_budget = the
# budget (so activation_checkpointing "auto" makes the plan's choice): peak RSS (max over ranks
# and steps, from --metrics) against the budget, and the time of the last step. A length whose
# run would take too long on this machine (above MAX_RUN_SEQ tokens) is planned, not run. Then
# the step-time cost of offload at COST_SEQ tokens: COST_STEPS steps without and with, COST_REPEATS
# times alternating (a shared machine's load moves between runs), mean of steps 2..N, with the
# time the step was blocked on the file and the I/O thread's busy time (from --metrics). Model: bench/activation_offload.json (32 layers, hidden 64: the kept block inputs,
# 33 x [S, 64] fp32, are most of the memory at long S). One rank, THREADS (2) intra-op threads.
# The offload file goes to OFFLOAD_DIR (default a fresh directory under /var/tmp, a disk here).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longtrain}
CFG=${CFG:-bench/activation_offload.json}
BUDGETS=${BUDGETS-"320MiB 2GiB"}  # BUDGETS="" measures only the cost
STEPS=${STEPS:-2}
THREADS=${THREADS:-2}
MAX_RUN_SEQ=${MAX_RUN_SEQ:-40000}
COST_SEQ=${COST_SEQ:-8192}
COST_STEPS=${COST_STEPS:-4}
COST_REPEATS=${COST_REPEATS:-2}
OFFLOAD_DIR=${OFFLOAD_DIR:-$(mktemp -d /var/tmp/longtrain-offload-bench.XXXXXX)}
out=$(mktemp -d)
python3 - "$BIN" "$CFG" "$BUDGETS" "$STEPS" "$THREADS" "$MAX_RUN_SEQ" "$COST_SEQ" "$COST_STEPS" "$OFFLOAD_DIR" "$out" "$COST_REPEATS" <<'PY'
import json, re, subprocess, sys, os
binary, cfg, budgets, steps, threads, max_run, cost_seq, cost_steps, odir, out, repeats = sys.argv[1:12]
steps, max_run, cost_seq, cost_steps, repeats = int(steps), int(max_run), int(cost_seq), int(cost_steps), int(repeats)
OFF = ["--set", f"train.offload_dir={odir}"]

def plan(budget, extra):
    r = subprocess.run([binary, "plan", cfg, "--max-seq", budget] + extra, stdout=subprocess.PIPE, text=True, check=True)
    mb = float(re.search(r"budget ([\d.]+) MiB", r.stdout).group(1))
    m = re.search(r"this config: longest seq_len (\d+) \(predicted peak (\d+) MiB\)", r.stdout)
    return mb, int(m.group(1)), int(m.group(2))

def train(seq, n, budget, extra, tag):
    args = [binary, "train", cfg, "--set", f"data.seq_len={seq}", "--set", f"train.steps={n}",
            "--set", f"train.threads={threads}", "--metrics", f"{out}/{tag}.jsonl"] + extra
    if budget: args += ["--set", f"train.memory_budget={budget}"]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    open(f"{out}/{tag}.log", "w").write(r.stdout)
    if r.returncode != 0:
        return None, r.stdout.strip().splitlines()[-1]
    return [json.loads(l) for l in open(f"{out}/{tag}.jsonl")], ""

print(f"model {cfg}; offload dir {odir}; {threads} threads; logs in {out}")
if budgets.split():
    print("| budget | offload | longest seq_len (plan) | x without | predicted peak MiB | graphs kept (auto) | measured peak MiB | within budget | last step s | tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
for budget in budgets.split():
    base = None
    for name, extra in (("no", []), ("yes", OFF)):
        mb, seq, pred = plan(budget, extra)
        base = base or seq
        row = f"| {budget} | {name} | {seq} | {seq / base:.2f} | {pred} |"
        if seq > max_run:
            print(row + f" - | not run (> {max_run} tokens: too long a step on this machine) | - | - | - |")
            continue
        rows, err = train(seq, steps, budget, extra, f"{budget}-{name}")
        if rows is None:
            print(row + f" - | failed: {err} | - | - | - |")
            continue
        peak = max(x["peak_rss_bytes"] for x in rows) / 2**20
        kept = re.search(r'"auto": (\d+) of', open(f"{out}/{budget}-{name}.log").read())
        print(row + f" {kept.group(1) if kept else '?'} | {peak:.0f} | {'yes' if peak <= mb else 'NO (+%.1f%%)' % (100 * (peak / mb - 1))} | "
              f"{rows[-1]['step_time_s']:.2f} | {rows[-1]['tokens_per_s']:.0f} |")
        sys.stdout.flush()

print(f"\nstep-time cost at seq_len {cost_seq} ({cost_steps} steps each, mean of steps 2..{cost_steps}, "
      f"activation_checkpointing all; runs alternate without / with, {repeats} of each):")
print("| run | offload | mean step s | tokens/s | blocked on the file s/step | I/O thread s/step | peak RSS MiB |")
print("|---|---|---|---|---|---|---|")
means = {"no": [], "yes": []}
for rep in range(repeats):
    for name, extra in (("no", []), ("yes", OFF)):
        rows, err = train(cost_seq, cost_steps, None, extra + ["--set", "activation_checkpointing=all"], f"cost-{name}-{rep}")
        if rows is None:
            print(f"| {rep + 1} | {name} | failed: {err} | - | - | - | - |")
            continue
        later = rows[1:]
        t = sum(x["step_time_s"] for x in later) / len(later)
        wait = sum(x.get("offload_wait_s", 0) for x in later) / len(later)
        io = sum(x.get("offload_io_s", 0) for x in later) / len(later)
        means[name].append(t)
        peak = max(x["peak_rss_bytes"] for x in rows) / 2**20
        print(f"| {rep + 1} | {name} | {t:.3f} | {cost_seq / t:.0f} | {wait:.3f} | {io:.3f} | {peak:.0f} |")
        sys.stdout.flush()
if means["no"] and means["yes"]:
    a, b = sum(means["no"]) / len(means["no"]), sum(means["yes"]) / len(means["yes"])
    print(f"\nmean step: without {a:.3f} s, with {b:.3f} s: x{b / a:.3f}")
PY
rmdir "$OFFLOAD_DIR" 2>/dev/null || true
