#!/usr/bin/env bash
# bench/zero_memory.sh: per-rank memory of ZeRO stages 0-3 at world 1, 2 and 4 (process ranks,
# 1 thread each) on examples/offload_bench.json (25M params): the memory ledger (fp32
# masters, full-parameter replicas of stages 1 and 2, gradient partitions, Adam states,
# peak of gathered parameters at stage 3), the memory model's predicted peak, the measured
# peak RSS, and the median step time of steps 2..STEPS.
# Usage: bench/zero_memory.sh [CONFIG] [STEPS=5]   (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/longtrain
CFG=${1:-examples/offload_bench.json}
STEPS=${2:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
lscpu | grep -E "^Model name|^CPU\(s\)" || true
printf "%-6s %-6s %-11s %-11s %-10s %-9s %-11s %-13s %-13s %-8s\n" stage world master_MiB replica_MiB grads_MiB adam_MiB gathered_MiB predicted_MiB peak_rss_MiB step_s
for W in 1 2 4; do
  for S in 0 1 2 3; do
    [ "$W" = 1 ] && [ "$S" != 0 ] && [ "$S" != 3 ] && continue
    log="$out/s${S}w${W}.log"
    $BIN train "$CFG" --nproc $W --set train.steps="$STEPS" --set train.threads=1 --set zero_optimization.stage=$S \
      $( [ "$S" = 0 ] && echo "--set zero_optimization.offload_optimizer.device=none" ) \
      --metrics "$out/s${S}w${W}.jsonl" > "$log"
    predicted=$(grep -o "predicted peak [0-9]* MiB" "$log" | grep -o "[0-9]*" | head -1)
    python3 - "$out/s${S}w${W}.jsonl" "$S" "$W" "${predicted:-0}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
r = rows[-1]
M = 2**20
get = lambda k: f"{r[k] / M:.1f}" if k in r else "-"
step = statistics.median(x["step_time_s"] for x in rows[1:])
print(f"{sys.argv[2]:<6} {sys.argv[3]:<6} {get('zero_param_bytes'):<11} {get('zero_replica_bytes'):<11} {get('zero_grad_bytes'):<10} "
      f"{get('zero_optim_bytes'):<9} {get('zero_gathered_peak_bytes'):<11} {sys.argv[4]:<13} {r['peak_rss_bytes'] / M:<13.0f} {step:<8.3f}")
PY
  done
done
