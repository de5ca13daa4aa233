#!/usr/bin/env bash
# bench/sp_ring_e2e.sh: whole training steps at seq 8192 (examples/sp_bench.json with the fused
# core: hidden 128, 8 heads, 4 kv heads) under Ulysses, Ulysses x ring and ring SP at P = 2, 4
# process ranks, 1 intra-op thread each (P = 4 oversubscribes 2 cores). 3 steps; prints the
# mean step time of steps 2-3, tokens/s and the largest rank's peak RSS.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longtrain}; out=$(mktemp -d)
printf "| P | ring degree | layout | step s (mean of steps 2-3) | tokens/s | peak RSS MiB |\n|---|---|---|---|---|---|\n"
for pr in "2 1" "2 2" "4 1" "4 2" "4 4"; do
  set -- $pr
  $BIN train examples/sp_bench.json --nproc $1 --set sequence_parallel_size=$1 --set sequence_parallel_ring_degree=$2 \
    --set data.seq_len=8192 --set model.attention=fused --set train.steps=3 --set train.threads=1 --metrics $out/r.jsonl > $out/log 2>&1 || { tail -3 $out/log; continue; }
  lay=$(grep -o "sp=[0-9]*: [^,]*, [a-z]*" $out/log | head -1)
  python3 - $out/r.jsonl $1 $2 "$lay" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
st = rows[1:] or rows
t = sum(r["step_time_s"] for r in st) / len(st)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {t:.2f} | {rows[0]['tokens'] / t:.0f} | {max(r['peak_rss_bytes'] for r in rows) / 2**20:.0f} |")
PY
done
