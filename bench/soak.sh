#!/usr/bin/env bash
# A long run watched for leaks (not a test): the quick start (SP 2, 2 ranks) for STEPS steps
# with an evaluation and a checkpoint every 250 steps (keep_last 2, so old ones are pruned),
# then rank 0's per-step `rss_bytes` and `open_fds` from the metrics: RSS growth from the end
# of warm-up (step WARM) to the last step, and the range of fds after warm-up. Beside them,
# bench/heap_sampler.c (LD_PRELOAD) records rank 0's tcmalloc counters and RssAnon/RssFile
# every 250 ms, so growth is split into bytes the program holds (a leak) and bytes the
# allocator keeps in its free lists (retention).
# Usage: bench/soak.sh [STEPS=2000] [WARM=200] [longtrain flags, e.g. --set train.eval_every=0]
# (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-2000}
WARM=${2:-200}
shift $(( $# < 2 ? $# : 2 ))
OUT=$(mktemp -d /tmp/longtrain-soak.XXXXXX)
trap 'rm -rf "$OUT/ckpt"' EXIT  # the metrics stay in $OUT
lscpu | grep -E "^Model name|^CPU\(s\)" || true
cc -O2 -shared -fPIC -o build/heap_sampler.so bench/heap_sampler.c -ldl -pthread
LT_HEAP_SAMPLE="$OUT/heap" LT_HEAP_SAMPLE_MS=250 LD_PRELOAD="$PWD/build/heap_sampler.so" \
/usr/bin/time -v ./build/longtrain train examples/quickstart.json --metrics "$OUT/metrics.jsonl" \
  --set train.steps="$STEPS" --set scheduler.params.total_num_steps="$STEPS" --set train.eval_every=250 \
  --set train.checkpoint.dir="$OUT/ckpt" --set train.checkpoint.every_steps=250 --set train.checkpoint.keep_last=2 \
  --set steps_per_print=500 "$@" 2> "$OUT/time.txt" &
RUN=$!
# The step the run is at, once a second (the metrics carry no wall time), to place the samples;
# rank 0's /proc/PID/smaps at the end of warm-up and before the last step, to say which
# mappings grew.
R0=
while kill -0 $RUN 2>/dev/null; do
  step=$(tail -c 4096 "$OUT/metrics.jsonl" 2>/dev/null | tail -1 | grep -o '"step":[0-9]*' | cut -d: -f2 || true)
  echo "$(date +%s.%N) $step" >> "$OUT/steps.txt"
  if [ -z "$R0" ]; then
    for p in $(pgrep -P "$(pgrep -P $RUN | head -1)" 2>/dev/null); do
      tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=0 && R0=$p
    done
  fi
  if [ -n "$R0" ] && [ -n "$step" ] && [ "$step" -ge "$WARM" ] && [ "$step" -lt "$STEPS" ]; then
    [ -e "$OUT/smaps.warm" ] || cp /proc/$R0/smaps "$OUT/smaps.warm" 2>/dev/null || true
    cp /proc/$R0/smaps "$OUT/smaps.tmp" 2>/dev/null && mv "$OUT/smaps.tmp" "$OUT/smaps.last" || true
  fi
  sleep 1
done
wait $RUN
grep -E "Maximum resident|Elapsed" "$OUT/time.txt" || true
echo "metrics: $OUT/metrics.jsonl"
python3 - "$OUT" "$WARM" <<'PY'
import json, sys, os
out, warm = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl") if l.strip()]
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
# Rank 0's heap samples, each placed at the step the run had reached then.
steps = [(float(p[0]), int(p[1])) for p in (l.split() for l in open(f"{out}/steps.txt")) if len(p) == 2]
path = f"{out}/heap.rank0"
if not os.path.exists(path) or not steps:
    print("no heap samples (bench/heap_sampler.c)"); sys.exit()
samples = []
# Up to the last poll that saw a step before the last (not the last step's eval and exit).
end = max((ts for ts, s in steps if s < rows[-1]["step"]), default=0)
for l in open(path):
    t, used, free, unmapped, heap, anon, file = l.split()[:7]
    at = [s for ts, s in steps if ts <= float(t)]
    if at and float(t) <= end: samples.append((at[-1], int(used), int(free), int(unmapped), int(heap), int(anon), int(file)))
MiB = 2**20
w = [s for s in samples if s[0] >= warm]
if len(w) < 20:
    print("too few heap samples after warm-up"); sys.exit()
# In use swings within a step (activations come and go), so each window gives its least and
# most: a leak raises the least; retention raises the heap while the most stays put.
print("rank 0 after warm-up, MiB, by window of steps: in use = tcmalloc's bytes held by the program "
      "(least .. most over the window's samples); heap = tcmalloc's mapped heap (in use + its free lists); "
      "page-heap free at the window's end")
print("  steps           in use          heap  pg-free   RssAnon   RssFile")
wins = [w[len(w) * i // 10:len(w) * (i + 1) // 10] for i in range(10)]
for x in wins:
    print(f"{x[0][0]:5d}-{x[-1][0]:<5d} {min(s[1] for s in x) / MiB:6.1f} .. {max(s[1] for s in x) / MiB:5.1f} "
          f"{max(s[4] - s[3] for s in x) / MiB:9.1f} {x[-1][2] / MiB:8.1f} {max(s[5] for s in x) / 1024:9.1f} "
          f"{max(s[6] for s in x) / 1024:9.1f}")
a, b = wins[0], wins[-1]
f = lambda x, i: min(s[i] for s in x)
g = lambda x, i: max(s[i] for s in x)
h = lambda x: max(s[4] - s[3] for s in x)
print(f"first to last window: in use least {(f(b, 1) - f(a, 1)) / MiB:+.2f} MiB, most {(g(b, 1) - g(a, 1)) / MiB:+.2f} MiB; "
      f"mapped heap {(h(b) - h(a)) / MiB:+.2f} MiB; RssAnon {(g(b, 5) - g(a, 5)) / 1024:+.2f} MiB; "
      f"RssFile {(g(b, 6) - g(a, 6)) / 1024:+.2f} MiB")

def smaps(path):  # {(range, name): rss kB}, and [heap]'s size and rss (kB)
    m, key, heap = {}, None, [0, 0]
    for l in open(path):
        p = l.split()
        if "-" in p[0] and len(p) >= 5 and not p[0].endswith(":"):
            key = (p[0].split("-")[0], p[5] if len(p) > 5 else "[anon]")  # by start: [heap] grows at its end
        elif p[0] == "Rss:":
            m[key] = m.get(key, 0) + int(p[1])
        if key and key[1] == "[heap]" and p[0] in ("Size:", "Rss:"):
            heap[p[0] == "Rss:"] += int(p[1])
    return m, heap
if os.path.exists(f"{out}/smaps.warm") and os.path.exists(f"{out}/smaps.last"):
    (a, ha), (b, hb) = smaps(f"{out}/smaps.warm"), smaps(f"{out}/smaps.last")
    print(f"rank 0's [heap] (tcmalloc's sbrk arena): size {ha[0] / 1024:.1f} MiB, resident {ha[1] / 1024:.1f} MiB at the end "
          f"of warm-up; size {hb[0] / 1024:.1f} MiB, resident {hb[1] / 1024:.1f} MiB before the last step")
    kind = lambda k: k[1] if k[1].startswith("[") else "files"
    grew = {}
    for k in set(a) | set(b):
        grew[kind(k)] = grew.get(kind(k), 0) + b.get(k, 0) - a.get(k, 0)
    print("rank 0's resident memory, end of warm-up to the last step, by mapping kind (kB): "
          + ", ".join(f"{k} {v:+d}" for k, v in sorted(grew.items()) if v))
    big = sorted(((b.get(k, 0) - a.get(k, 0), k) for k in set(a) | set(b)), reverse=True)[:5]
    print("  largest: " + ", ".join(f"{k[1]} {k[0]} {d:+d} kB" for d, k in big if d > 0))
PY
