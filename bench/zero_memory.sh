#!/usr/bin/env bash
# bench/zero_memory.sh: per-rank memory under ZeRO-3 at world 1, 2 and 4 (process ranks),
# from the memory ledger (parameters, gradients and Adam states held by one rank; peak of
# gathered full parameters) and the peak RSS, on examples/offload_bench.json (25M params).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/longtrain
CFG=${1:-examples/offload_bench.json}
out=$(mktemp -d)
printf "%-6s %-14s %-14s %-14s %-16s %-12s\n" world params_MiB grads_MiB adam_MiB gathered_pk_MiB peak_rss_MiB
for W in 1 2 4; do
  $BIN train "$CFG" --nproc $W --set train.steps=3 --set train.threads=1 --metrics "$out/w$W.jsonl" >/dev/null
  python3 - "$out/w$W.jsonl" $W <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
M = 2**20
print(f"{sys.argv[2]:<6} {r['zero_param_bytes']/M:<14.1f} {r['zero_grad_bytes']/M:<14.1f} {r['zero_optim_bytes']/M:<14.1f} "
      f"{r['zero_gathered_peak_bytes']/M:<16.1f} {r['peak_rss_bytes']/M:<12.0f}")
PY
done
