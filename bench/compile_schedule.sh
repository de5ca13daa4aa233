#!/usr/bin/env bash
# bench/compile_schedule.sh: DeepSpeed's default ZeRO-3 schedule ([[0,[zero3]],
# [5,[zero3,prefetch,selective_gather]]]) against zero3 alone, at 2 and 4 process ranks,
# on examples/offload_bench.json (25M parameters, 32 tokens a rank: gathers dominate).
# Figures are means over steps 7..12 (after the default schedule's switch at step 5):
# step time, and exposed gather time (the first micro-batch's time blocked in Gather).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/longtrain
CFG=${1:-examples/offload_bench.json}
out=$(mktemp -d)
printf "%-6s %-18s %-10s %-18s\n" ranks schedule step_s exposed_gather_s
for W in 2 4; do
  for S in zero3 default; do
    extra=(--set compile.deepcompile=true)
    [ "$S" = zero3 ] && extra+=(--set 'compile.schedule=[[0,["zero3"]]]')
    $BIN train "$CFG" --nproc $W --set train.steps=12 --set train.threads=1 \
      --set zero_optimization.offload_optimizer.device=none "${extra[@]}" --metrics "$out/$W$S.jsonl" >/dev/null
    python3 - "$out/$W$S.jsonl" $W $S <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][6:]
t = sum(r["step_time_s"] for r in rows) / len(rows)
g = sum(r["exposed_gather_s"] for r in rows) / len(rows)
print(f"{sys.argv[2]:<6} {sys.argv[3]:<18} {t:<10.3f} {g:<18.3f}")
PY
  done
done
