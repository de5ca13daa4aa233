#!/usr/bin/env bash
# bench/checkpoint.sh: checkpoint write and read bandwidth beside the disk's own (dd, same
# run, same directory), and the step-time cost of checkpointing every N steps.
# Model: examples/offload_bench.json widened to ~80M parameters (ZeRO-3, world 1): a
# checkpoint holds fp32 master weights + Adam m + v, ~12 bytes a parameter.
# Runs: no checkpoints, sync saves, async saves (train.checkpoint.async).
# Usage: [THREADS=2] [EVERY=4] [STEPS=12] bench/checkpoint.sh [DIR] (default: a fresh
# directory under /tmp); cold reads need root (drop_caches), else they are reported as cached.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/longtrain
DIR=${1:-$(mktemp -d /tmp/longtrain_ckpt_bench.XXXX)}
EVERY=${EVERY:-4}
STEPS=${STEPS:-12}
CFG=examples/offload_bench.json
SETS=(--set model.hidden_size=768 --set model.num_layers=8 --set model.intermediate_size=2048
      --set train.threads=${THREADS:-2} --set steps_per_print=1000)
mkdir -p "$DIR"
drop() { sync; (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null && echo cold || echo cached; }

# 1. Step time without and with checkpoints every $EVERY steps.
$BIN train $CFG "${SETS[@]}" --set train.steps=$STEPS --metrics "$DIR/none.jsonl" >/dev/null
$BIN train $CFG "${SETS[@]}" --set train.steps=$STEPS --set train.checkpoint.dir="\"$DIR/ck\"" \
  --set train.checkpoint.every_steps=$EVERY --set train.checkpoint.keep_last=1 --metrics "$DIR/ck.jsonl" >/dev/null
$BIN train $CFG "${SETS[@]}" --set train.steps=$STEPS --set train.checkpoint.dir="\"$DIR/ac\"" \
  --set train.checkpoint.every_steps=$EVERY --set train.checkpoint.keep_last=1 --set train.checkpoint.async=true \
  --metrics "$DIR/ac.jsonl" >/dev/null
CK=$(ls -d "$DIR"/ck/step-* | tail -1)
BYTES=$(du -sb "$CK" | cut -f1)

# 2. Read: resume (verifies every CRC, then loads), cold and cached.
state=$(drop)
t_cold=$($BIN train $CFG "${SETS[@]}" --set train.steps=$((STEPS + 1)) --resume "$CK" | sed -n 's/.*loaded in \([0-9.]*\) s.*/\1/p')
t_warm=$($BIN train $CFG "${SETS[@]}" --set train.steps=$((STEPS + 1)) --resume "$CK" | sed -n 's/.*loaded in \([0-9.]*\) s.*/\1/p')

# 3. The disk itself: dd of the same size, fsynced; then read back cold.
MB=$(( (BYTES + 1048575) / 1048576 ))
ddw=$(dd if=/dev/zero of="$DIR/dd.bin" bs=1M count=$MB conv=fsync 2>&1 | tail -1)
drop >/dev/null
ddr=$(dd if="$DIR/dd.bin" of=/dev/null bs=1M 2>&1 | tail -1)
rm -f "$DIR/dd.bin"

python3 - "$DIR" "$BYTES" "$t_cold" "$t_warm" "$state" "$ddw" "$ddr" "$EVERY" <<'PY'
import json, sys, re
d, nbytes, tc, tw, state, ddw, ddr, every = sys.argv[1:]
nbytes = int(nbytes); tc = float(tc); tw = float(tw)
load = lambda p: [json.loads(l) for l in open(p)]
none, ck = load(f"{d}/none.jsonl"), load(f"{d}/ck.jsonl")
step = lambda rs: sum(r["step_time_s"] for r in rs[1:]) / (len(rs) - 1)
saves = [r["checkpoint_s"] for r in ck if "checkpoint_s" in r]
w = sum(saves) / len(saves)
def ddrate(line):
    m = re.search(r"([0-9.]+) ([kMG]?B)/s", line)
    return float(m.group(1)) * {"kB": 1e-6, "MB": 1e-3, "GB": 1, "B": 1e-9}[m.group(2)]
G = 1e9
print(f"checkpoint: {nbytes/2**20:.0f} MiB ({nbytes/12/1e6:.0f}M params x 12 B), {len(saves)} saves")
print(f"write  {nbytes/w/G:6.2f} GB/s  ({w:.2f} s a save, fsync included) | dd write+fsync {ddrate(ddw):.2f} GB/s")
print(f"read   {nbytes/tc/G:6.2f} GB/s  {state:6s} ({tc:.2f} s: CRC of every file + load) | dd read {ddrate(ddr):.2f} GB/s {state}")
print(f"read   {nbytes/tw/G:6.2f} GB/s  cached ({tw:.2f} s)")
ac = load(f"{d}/ac.jsonl")
s0 = step(none)
stall = sum(r["checkpoint_s"] for r in ac if "checkpoint_s" in r) / len(saves)
sa = step(ac)
print(f"step   {s0:.3f} s without checkpoints (mean of steps 2..)")
print(f"sync   a save stalls training {w:.2f} s = {w/(int(every)*s0)*100:.1f}% of {every} steps")
print(f"async  a save stalls training {stall:.2f} s (copy) = {stall/(int(every)*s0)*100:.1f}% of {every} steps; "
      f"mean step while writing in the background {sa:.3f} s ({(sa/s0-1)*100:+.1f}%)")
PY
