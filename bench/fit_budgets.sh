#!/usr/bin/env bash
# bench/fit_budgets.sh: `train --fit BUDGET` at several budgets: what it chose, its predicted
# peak and step time, and what the run measured (peak RSS, max over ranks and steps; the median
# step_time_s after the first step). Model: bench/fit_base.json (CFG=...), NPROC ranks (default
# 2), BUDGETS (default "1GiB 1536MiB 3GiB"). Every run checks its losses are finite and that the
# measured peak is within the budget. Time: ~10 min on 2 Zen 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longtrain}
CFG=${CFG:-bench/fit_base.json}
NPROC=${NPROC:-2}
BUDGETS=${BUDGETS:-"1GiB 1536MiB 3GiB"}
out=$(mktemp -d)
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p'), model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $NPROC ranks"
for b in $BUDGETS; do
  "$BIN" train "$CFG" --nproc "$NPROC" --fit "$b" --metrics "$out/$b.jsonl" >"$out/$b.log" 2>&1 ||
    { echo "budget $b: the run failed:"; tail -20 "$out/$b.log"; exit 1; }
  python3 - "$out/$b.jsonl" "$out/$b.log" "$b" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
log = open(sys.argv[2]).read()
assert rows and all(r["loss"] == r["loss"] and abs(r["loss"]) < 1e9 for r in rows), "a non-finite loss"
units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
m = re.fullmatch(r"([0-9.]+)(\w+)", sys.argv[3]); budget = float(m.group(1)) * units[m.group(2)]
chosen = re.search(r"^chosen: (.*)$", log, re.M).group(1)
peak_pred = float(re.search(r"peak ([0-9.]+) MiB a rank predicted", log).group(1))
step_pred = float(re.search(r"^  step ([0-9.]+) s a step", log, re.M).group(1))
peak = max(r["peak_rss_bytes"] for r in rows) / 2**20
step = statistics.median(r["step_time_s"] for r in rows[1:] or rows)
print(f"| {sys.argv[3]} | {chosen} | {peak_pred:.0f} | {peak:.0f} ({100 * (peak_pred - peak) / peak:+.1f}%) | "
      f"{step_pred:.2f} | {step:.2f} ({100 * (step_pred - step) / step:+.1f}%) |")
assert peak * 2**20 <= budget, f"measured peak {peak:.0f} MiB is over the budget {sys.argv[3]}"
PY
done
