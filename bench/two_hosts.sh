#!/usr/bin/env bash
# Gloo all-reduce between two "hosts" (network namespaces over a veth pair; needs root and
# iproute2) beside a raw TCP stream over the same veth, one way and both ways at once, timed
# by build/bench_allreduce_env in the same processes at each size (not a test). Runs it REPS
# times and prints each run and the per-size medians: the figures are noisy on a shared
# machine, so compare within a run, and over several.
# RATE=10gbit (or 1gbit, ...): each direction of the link shaped by a tc token bucket, as a real
# NIC would be; unset: the bare veth, where the kernel's copies on the shared cores are the wire.
# Usage: [RATE=R] bench/two_hosts.sh [REPS=3]   (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
N=ltbench$$
bash scripts/netns_hosts.sh up $N 79.0
OUT=$(mktemp -d /tmp/longtrain-two-hosts.XXXXXX)
trap "bash scripts/netns_hosts.sh down $N; rm -rf $OUT" EXIT
if [[ -n ${RATE:-} ]]; then
  for s in a b; do ip netns exec $N$s tc qdisc add dev ${N}v$s root tbf rate "$RATE" burst 1mb latency 50ms; done
  echo "link shaped to $RATE each way (tc tbf)"
fi
lscpu | grep -E "^Model name|^CPU\(s\)|^CPU family|^Model:" || true
E="WORLD_SIZE=2 MASTER_ADDR=10.79.0.1 MASTER_PORT=29701"
for r in $(seq 1 "$REPS"); do
  echo "== run $r of $REPS (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  F="LT_BENCH_N_FIRST=$((r % 2))"  # which of busbw_1 and busbw_n is timed first, by turns
  ip netns exec ${N}b env $E $F RANK=1 build/bench_allreduce_env > "$OUT/rank1.txt" 2>&1 &
  ip netns exec ${N}a env $E $F RANK=0 build/bench_allreduce_env | tee "$OUT/run$r.txt"
  wait $! || { cat "$OUT/rank1.txt"; exit 1; }
done
python3 - "$OUT" "$REPS" <<'PY'
import statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
runs = []
for r in range(1, reps + 1):
    rows = {}
    for l in open(f"{out}/run{r}.txt"):
        f = l.split()
        if f and f[0].isdigit():
            rows[int(f[0])] = [float(x) for x in f[1:5]]  # busbw_1 busbw_n raw_1way raw_2way
    runs.append(rows)
print(f"medians over {reps} run(s), GB/s: busbw_1 (one Gloo all-reduce), busbw_n (Comm: 2 pieces from 4 MiB), "
      "raw stream one way and each way of both at once; ratios of the medians")
print(f"{'MiB':>5} {'busbw_1':>8} {'busbw_n':>8} {'raw_1way':>9} {'raw_2way':>9} {'1/1way':>7} {'1/2way':>7} {'n/1way':>7} {'n/2way':>7}")
for s in sorted(runs[0]):
    b1, bn, r1, r2 = (statistics.median(x[s][i] for x in runs if s in x) for i in range(4))
    print(f"{s >> 20:5d} {b1:8.3f} {bn:8.3f} {r1:9.3f} {r2:9.3f} {100 * b1 / r1:6.0f}% {100 * b1 / r2:6.0f}% "
          f"{100 * bn / r1:6.0f}% {100 * bn / r2:6.0f}%")
PY
