#!/usr/bin/env bash
# bench/sp_scaling.sh: Ulysses SP at P = 1, 2, 4 process ranks for one fixed sequence length
# (examples/sp_bench.json: 4096 tokens, naive attention, so attention activations dominate).
# Prints step time (mean of steps 2..N), tokens/s and the peak RSS of the largest rank.
# Each rank gets max(1, cores/P) intra-op threads: on 2 cores, P = 4 oversubscribes.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/longtrain
CFG=${1:-examples/sp_bench.json}
out=$(mktemp -d)
printf "%-4s %-12s %-12s %-16s\n" "P" "step_s" "tokens/s" "peak_rss_MiB"
for P in 1 2 4; do
  $BIN train "$CFG" --nproc $P --set sequence_parallel_size=$P --metrics "$out/sp$P.jsonl" >/dev/null
  python3 - "$out/sp$P.jsonl" $P <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steady = rows[1:] or rows
t = sum(r["step_time_s"] for r in steady) / len(steady)
print(f"{sys.argv[2]:<4} {t:<12.3f} {rows[0]['tokens'] / t:<12.0f} {max(r['peak_rss_bytes'] for r in rows) / 2**20:<16.0f}")
PY
done
