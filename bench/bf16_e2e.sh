#!/usr/bin/env bash
# bench/bf16_e2e.sh: longtrain's e2e shapes (bench/e2e_*.json) in fp32, in bf16 with fp32 attention
# (bf16.attention=false) and in bf16, alternated REPS times in one sitting: median tokens/s after
# warm-up, MFU (each against its own GEMM peak), peak RSS.
# Non-obvious: bf16.only_if_faster stays true, so a CPU whose bf16 GEMM is slower runs fp32 twice (the log says so).
# Usage: [SHAPES="quickstart medium long"] [REPS=2] bash bench/bf16_e2e.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/longtrain
[[ -x $BIN ]] || { echo "bf16_e2e: $BIN not found; build longtrain first" >&2; exit 1; }
read -r -a shapes <<<"${SHAPES:-quickstart medium long}"
TMP=$(mktemp -d /tmp/longtrain_bf16.XXXX)
lscpu | grep -E '^(Model name|CPU family|Model):' | sed 's/  */ /g'
for s in "${shapes[@]}"; do
  for rep in $(seq "${REPS:-2}"); do
    for mode in fp32 bf16_attn_fp32 bf16; do
      bf16=true attn=true
      [[ $mode == fp32 ]] && bf16=false
      [[ $mode == bf16_attn_fp32 ]] && attn=false
      out=$TMP/${s}_${mode}_$rep
      $BIN train "bench/e2e_$s.json" --set bf16.enabled=$bf16 --set bf16.attention=$attn --metrics "$out.jsonl" \
        >"$out.log" 2>&1 || { echo "bf16_e2e: longtrain failed on $s ($mode):" >&2; cat "$out.log" >&2; exit 1; }
      grep -h 'bf16.enabled' "$out.log" || true
      python3 - "$out.jsonl" "$s" "$mode" "$rep" <<'PY'
import json, statistics, sys
path, shape, mode, rep = sys.argv[1:]
m = [json.loads(l) for l in open(path)]
kept = m[3 if len(m) >= 20 else 2:]
med = lambda k: statistics.median(r[k] for r in kept)
print(f"{shape:10s} run {rep} {mode:14s}: {med('tokens_per_s'):9.0f} tok/s, step {med('step_time_s'):.4f} s, "
      f"MFU {100 * med('mfu'):.1f}% of {m[-1]['gemm_peak_flops'] / 1e9:.0f} GFLOP/s, peak RSS {m[-1]['peak_rss_bytes'] / 2**20:.0f} MiB, "
      f"last loss {m[-1]['loss']:.4f}")
PY
    done
  done
done
echo "logs: $TMP"
