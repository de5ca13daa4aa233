#!/usr/bin/env bash
# bench/offload_overlap.sh: SuperOffload's overlap. One rank, ZeRO-3, a model whose
# optimizer is a sizable share of the step (examples/overlap_bench.json: 38M parameters in 8
# layers, embeddings 11% of them as in an LLM; 32 tokens a step). Means of steps 3..N:
#   sync-1: 1 core; the optimizer runs after backward (super_offload off).
#   super : 2 cores; backward on 1, CPU Adam worker pinned to the other, overlapping.
#   sync-2: 2 cores for everything, optimizer after backward.
# Hidden fraction = 1 - wait[super] / adam[sync-1]: the share of the optimizer's time that no
# longer shows in the step (what is left is step() waiting for the worker after backward).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/longtrain
CFG=${1:-examples/overlap_bench.json}
out=$(mktemp -d)
$BIN train "$CFG" --set train.threads=1 --metrics "$out/sync1.jsonl" >/dev/null
$BIN train "$CFG" --set train.threads=2 --set zero_optimization.offload_optimizer.super_offload=true --metrics "$out/super.jsonl" >/dev/null
$BIN train "$CFG" --set train.threads=2 --metrics "$out/sync2.jsonl" >/dev/null
python3 - "$out" <<'PY'
import json, sys
def mean(name, key):
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{name}.jsonl")][2:]
    return sum(r[key] for r in rows) / len(rows)
print(f"{'run':<8} {'step_s':>8} {'adam_in_step_s':>15} {'wait_s':>8}")
for n in ["sync1", "super", "sync2"]:
    print(f"{n:<8} {mean(n,'step_time_s'):>8.3f} {mean(n,'optimizer_adam_s'):>15.3f} {mean(n,'optimizer_wait_s'):>8.3f}")
t1, ts, a1 = mean("sync1", "step_time_s"), mean("super", "step_time_s"), mean("sync1", "optimizer_adam_s")
ws = mean("super", "optimizer_wait_s")
print(f"worker per step: speculative Adam {mean('super','worker_adam_s')*1000:.0f} ms")
print(f"optimizer time hidden: {(1 - ws / a1) * 100:.0f}% (exposed {ws*1000:.0f} of {a1*1000:.0f} ms); "
      f"step super/sync-1 {ts / t1:.2f}x, super/sync-2 {ts / mean('sync2','step_time_s'):.2f}x")
PY
