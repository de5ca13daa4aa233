#!/usr/bin/env bash
# bench/e2e_libtorch2.sh: longtrain's end-to-end shapes (bench/e2e_*.json) on the libtorch 1.13
# build (build/, the host) and the 2.6 build (build-libtorch2/, in scripts/debian13_root.sh's
# Debian 13 root), median tokens/s after warm-up, as bench/e2e.sh counts it.
# Non-obvious: the two builds alternate within every round of every shape, so a drift of the
# machine's speed in the sitting hits both alike; the 2.6 side runs on Debian 13's whole stack
# (its OpenBLAS, tcmalloc and glibc too), which is what a user of that libtorch gets.
# Usage: [SHAPES="quickstart medium long"] [ROUNDS=N] bash bench/e2e_libtorch2.sh (root)
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a shapes <<<"${SHAPES:-quickstart medium long}"
ROUNDS="${ROUNDS:-2}"
for b in build build-libtorch2; do
  [[ -x $b/longtrain ]] || { echo "e2e_libtorch2: $b/longtrain not found; run scripts/build.sh and scripts/test_libtorch2.sh first" >&2; exit 1; }
done
for s in "${shapes[@]}"; do
  [[ -f bench/e2e_$s.json ]] || { echo "e2e_libtorch2: no config bench/e2e_$s.json (SHAPES=${shapes[*]})" >&2; exit 1; }
done
OUT="build-libtorch2/e2e-$(date +%Y%m%d-%H%M%S)"  # visible inside the root too
mkdir -p "$OUT"

run() {  # run VERSION SHAPE ROUND
  local cfg="bench/e2e_$2.json" metrics="$OUT/$2.$1.$3.jsonl"
  local cmd=(train "$cfg" --metrics "$metrics")
  if [[ $1 == 1.13 ]]; then ./build/longtrain "${cmd[@]}" >"$metrics.log" 2>&1
  else bash scripts/debian13_root.sh --bind "$PWD" -- ./build-libtorch2/longtrain "${cmd[@]}" >"$metrics.log" 2>&1; fi ||
    { echo "e2e_libtorch2: libtorch $1 failed on $cfg:" >&2; cat "$metrics.log" >&2; exit 1; }
}

echo "## machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; results in $OUT"
for s in "${shapes[@]}"; do
  for ((r = 1; r <= ROUNDS; r++)); do run 1.13 "$s" "$r"; run 2.6 "$s" "$r"; done
done

python3 - "$OUT" "$ROUNDS" "${shapes[@]}" <<'PY'
import json, statistics, sys
out, rounds, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def tokens_per_s(version, shape):
    # bench/e2e.sh's warm-up: 3 steps from 20 steps on, else 2; median over the rest, all rounds.
    kept = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{out}/{shape}.{version}.{r}.jsonl")]
        warm = 3 if len(rows) >= 20 else 2
        kept += [row["tokens_per_s"] for row in rows if row["step"] > warm]
    return statistics.median(kept), len(kept)
print("| shape | libtorch 1.13 tok/s | libtorch 2.6 tok/s | 2.6 / 1.13 | steps counted (each) |")
print("|---|---|---|---|---|")
for s in shapes:
    (a, n), (b, _) = tokens_per_s("1.13", s), tokens_per_s("2.6", s)
    print(f"| {s} | {a:.0f} | {b:.0f} | {b / a:.3f}x | {n} |")
PY
