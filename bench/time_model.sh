#!/usr/bin/env bash
# bench/time_model.sh: the time model against measured step time. For each of bench/e2e.sh's
# shapes (bench/e2e_<shape>.json) it prints `longtrain plan`'s predicted step (rates measured in
# that process, at the shapes the run uses: plan/time_model.h) and the median step_time_s of a
# training run (its first 2 steps dropped: warm-up), then the relative error. The model's
# target is within 15%. Run it on an otherwise quiet machine: both figures move with the load,
# and not by the same amount (the prediction is measured in a second, the run over many).
# SHAPES="quickstart long" picks shapes; BIN picks the binary. BUDGET=16GiB runs and plans both
# under train.memory_budget (decommit: the model adds its page faults). Time: ~3 min on 2 Zen 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longtrain}
SHAPES=${SHAPES:-"quickstart medium long wide long16k"}
out=$(mktemp -d)
budget=()
[[ -z ${BUDGET:-} ]] || budget=(--set "train.memory_budget=\"$BUDGET\"")
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p'), model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "| %-10s | %12s | %12s | %7s | %s |\n" shape predicted_s measured_s error "predicted breakdown"
printf "|%s|%s|%s|%s|%s|\n" ------------ -------------- -------------- --------- ---------------------
for shape in $SHAPES; do
  cfg=bench/e2e_$shape.json
  plan=$("$BIN" plan "$cfg" "${budget[@]}" | grep '^step ')
  predicted=$(sed -E 's/^step ([0-9.]+) s.*/\1/' <<<"$plan")
  "$BIN" train "$cfg" "${budget[@]}" --metrics "$out/$shape.jsonl" >"$out/$shape.log" 2>&1
  python3 - "$out/$shape.jsonl" "$predicted" "$shape" "$plan" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
kept = rows[2:] if len(rows) > 3 else rows
assert all(r["loss"] == r["loss"] for r in rows), "a NaN loss: the run is broken"
measured = statistics.median(r["step_time_s"] for r in kept)
predicted = float(sys.argv[2])
breakdown = sys.argv[4].split("(", 1)[1].split(")")[0]
print(f"| {sys.argv[3]:10s} | {predicted:12.4f} | {measured:12.4f} | {100 * (predicted - measured) / measured:+6.1f}% | {breakdown} |")
PY
done
