#!/usr/bin/env bash
# bench/zero_bf16_comm.sh: ZeRO under bf16 GEMMs in three modes, alternated REPS times in one
# sitting: fp32 everywhere (bf16.gathers=false), bf16 parameter gathers and replica refreshes
# (bf16.gathers, the default), and also bf16 gradient reduce-scatters (communication_data_type
# "bf16"). One rank on each of two "hosts" (network namespaces over a veth pair whose both ends
# are limited to RATE by a token bucket: a commodity link instead of the kernel's memcpy). Prints
# each run's median step time after warm-up and the time exposed waiting for gathers and for the
# optimizer step's reduce-scatters, and checks that the first two modes end on the same losses
# (they must agree bit for bit). Needs root, iproute2's `ip` and `tc`.
# Usage: [RATE=1gbit] [STAGES="3 2"] [REPS=2] bash bench/zero_bf16_comm.sh [CONFIG]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/longtrain
CFG=${1:-examples/offload_bench.json}
RATE=${RATE:-1gbit}
read -r -a stages <<<"${STAGES:-3 2}"
[[ -x $BIN ]] || { echo "zero_bf16_comm: $BIN not found; build longtrain first" >&2; exit 1; }
N=ltgb$$
bash scripts/netns_hosts.sh up $N 83.0
OUT=$(mktemp -d /tmp/longtrain-bf16-comm.XXXXXX)
trap 'bash scripts/netns_hosts.sh down $N; rm -rf "$OUT"' EXIT
for s in a b; do ip netns exec ${N}$s tc qdisc add dev ${N}v$s root tbf rate "$RATE" burst 512kb latency 100ms; done
lscpu | grep -E '^(Model name|CPU family|Model|CPU\(s\)):' | sed 's/  */ /g'
echo "config $CFG, link $RATE each way, 1 rank per host, 1 thread, bf16.enabled (forced), 10 steps"
port=29850
for st in "${stages[@]}"; do
  for rep in $(seq "${REPS:-2}"); do
    for mode in fp32 gathers reduce; do
      gathers=true comm=fp32
      [[ $mode == fp32 ]] && gathers=false
      [[ $mode == reduce ]] && comm=bf16
      port=$((port + 1))
      A=(--nnodes 2 --nproc-per-node 1 --master-addr 10.83.0.1 --master-port $port --rdzv-id gb$port)
      S=(--set train.threads=1 --set bf16.enabled=true --set bf16.only_if_faster=false --set bf16.gathers=$gathers
         --set communication_data_type=$comm --set zero_optimization.stage="$st" --set train.steps=10)
      ip netns exec ${N}b $BIN train "$CFG" "${A[@]}" --node-rank 1 "${S[@]}" >"$OUT/b.log" 2>&1 &
      M=$OUT/m_${st}_${mode}.jsonl
      ip netns exec ${N}a $BIN train "$CFG" "${A[@]}" --node-rank 0 "${S[@]}" --metrics "$M" >"$OUT/a.log" 2>&1 ||
        { echo "zero_bf16_comm: node 0 failed:" >&2; cat "$OUT/a.log" "$OUT/b.log" >&2; exit 1; }
      wait $! || { echo "zero_bf16_comm: node 1 failed:" >&2; cat "$OUT/b.log" >&2; exit 1; }
      python3 - "$M" "$st" "$mode" "$rep" <<'PY'
import json, statistics, sys
path, stage, mode, rep = sys.argv[1:]
label = {"fp32": "fp32 gathers, fp32 reduce", "gathers": "bf16 gathers, fp32 reduce", "reduce": "bf16 gathers, bf16 reduce"}[mode]
m = [json.loads(l) for l in open(path)]
kept = m[3:]
med = lambda k: statistics.median(r.get(k, 0) for r in kept)
print(f"stage {stage} run {rep} {label}: step {med('step_time_s'):.3f} s, exposed gathers "
      f"{med('exposed_gather_s'):.3f} s, optimizer wait {med('optimizer_wait_s'):.3f} s, last loss {m[-1]['loss']!r}")
PY
    done
    python3 - "$OUT/m_${st}_fp32.jsonl" "$OUT/m_${st}_gathers.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
if a != b:
    sys.exit(f"zero_bf16_comm: the losses differ between fp32 and bf16 gathers: {a} vs {b}")
PY
  done
done
