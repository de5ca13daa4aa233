#!/usr/bin/env bash
# A long run watched for leaks (not a test): the quick start (SP 2, 2 ranks) for STEPS steps
# with an evaluation and a checkpoint every 250 steps (keep_last 2, so old ones are pruned),
# then rank 0's per-step `rss_bytes` and `open_fds` from the metrics: RSS growth from the end
# of warm-up (step WARM) to the last step, and the range of fds after warm-up.
# Usage: bench/soak.sh [STEPS=2000] [WARM=200]   (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-2000}
WARM=${2:-200}
OUT=$(mktemp -d /tmp/longtrain-soak.XXXXXX)
trap 'rm -rf "$OUT/ckpt"' EXIT  # the metrics stay in $OUT
lscpu | grep -E "^Model name|^CPU\(s\)" || true
/usr/bin/time -v ./build/longtrain train examples/quickstart.json --metrics "$OUT/metrics.jsonl" \
  --set train.steps="$STEPS" --set scheduler.params.total_num_steps="$STEPS" --set train.eval_every=250 \
  --set train.checkpoint.dir="$OUT/ckpt" --set train.checkpoint.every_steps=250 --set train.checkpoint.keep_last=2 \
  --set steps_per_print=500 2> "$OUT/time.txt"
grep -E "Maximum resident|Elapsed" "$OUT/time.txt" || true
echo "metrics: $OUT/metrics.jsonl"
python3 - "$OUT/metrics.jsonl" "$WARM" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
warm = int(sys.argv[2])
after = [r for r in rows if r["step"] >= warm]
assert len(after) > 1, "the run ended before the warm-up did"
rss0, rss1 = after[0]["rss_bytes"], after[-1]["rss_bytes"]
peak = max(r["rss_bytes"] for r in after)
fds = [r["open_fds"] for r in after]
print(f"steps {rows[0]['step']}..{rows[-1]['step']}, warm-up to step {warm}")
print(f"rss at step {after[0]['step']}: {rss0 / 2**20:.1f} MiB; at step {after[-1]['step']}: {rss1 / 2**20:.1f} MiB; "
      f"growth {100 * (rss1 - rss0) / rss0:+.2f}% (max after warm-up {peak / 2**20:.1f} MiB, {100 * (peak - rss0) / rss0:+.2f}%)")
marks = [r for r in after if r["step"] % max(1, len(rows) // 10) == 0]
print("rss MiB by step: " + ", ".join(f"{r['step']}: {r['rss_bytes'] / 2**20:.1f}" for r in marks))
tail = [r for r in rows if r["step"] >= len(rows) // 2]
print(f"second half: {100 * (tail[-1]['rss_bytes'] - tail[0]['rss_bytes']) / tail[0]['rss_bytes']:+.2f}% from step {tail[0]['step']}")
print(f"open fds after warm-up: min {min(fds)}, max {max(fds)}; first {fds[0]}, last {fds[-1]}")
print(f"loss: first {rows[0]['loss']:.4f}, last {rows[-1]['loss']:.4f}")
PY
