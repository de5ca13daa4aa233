#!/usr/bin/env bash
# bench/plan_accuracy.sh: the memory model against measured peak RSS. For each config (naive,
# chunked or fused attention, fused kernels on/off, tiling on/off, 1k-16k tokens, SP = 1/2/4 process ranks,
# ring and Ulysses x ring SP, ZeRO 0-3 with and without SuperOffload, deep models, disk offload,
# packed documents, bf16 GEMMs: plan assumes bf16 is chosen, so those rows force it with
# bf16.only_if_faster=false; otherwise a start-up measurement decides, and a row ran fp32 one day
# and bf16 the next)
# it prints `longtrain plan`'s per-rank prediction, the peak RSS of 2 training steps (max over
# ranks and steps, from --metrics) and the relative error. Model: bench/plan_base.json.
# Each rank runs 1 intra-op thread (THREADS; memory does not depend on it, and on a shared
# 2-core machine more threads only spin). ROWS="7 8" runs only those rows. OUT=dir keeps each
# row's metrics there; with REUSE=1 a row whose metrics are already there is not trained again
# (plan alone runs: how a change to the model is checked against the same measurements).
# Time: rows 1-34 take ~20 min on 2 loaded Zen 2 cores; rows 35-36 (32 layers at 16384 tokens)
# ~13 min a step each there (ROWS="$(seq -s ' ' 1 34)" leaves them out).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longtrain}
CFG=${1:-bench/plan_base.json}
THREADS=${THREADS:-1}
ROWS=${ROWS:-}
out=${OUT:-$(mktemp -d)}
REUSE=${REUSE:-0}
# BUDGET=4GiB sets train.memory_budget on every row: tcmalloc then decommits freed spans (the
# mode a run at `plan --max-seq`'s length or under --fit runs in), and plan predicts that mode.
BUDGET=${BUDGET:-}
mkdir -p "$out" "$out/offload"
# Packed documents: a uint16 token file, EOS (1) every 1500 tokens.
python3 -c "
import random, struct, sys
random.seed(1); n = 200000
t = [1 if i % 1500 == 1499 else random.randrange(2, 16384) for i in range(n)]
open(sys.argv[1], 'wb').write(struct.pack('<%dH' % n, *t))" "$out/docs.bin"
N="--set model.attention=naive"; C="--set model.attention=chunked --set model.attention_chunk=256"
F="--set model.attention=fused"; U="--set model.fused_kernels=false"
L="--set model.loss_chunk=256"; T="--set model.tiled_mlp=true"
Z="--set zero_optimization.stage=3"; B="--set bf16.enabled=true --set bf16.only_if_faster=false"
SO="--set zero_optimization.offload_optimizer.device=cpu --set zero_optimization.offload_optimizer.super_offload=true"
Z1="--set zero_optimization.stage=1"; Z2="--set zero_optimization.stage=2"
D16="--set model.num_layers=16 --set activation_checkpointing=\"all\""
D32="--set model.num_layers=32 --set activation_checkpointing=\"all\""; OFF="--set train.offload_dir=\"$out/offload\""
PK="--set data.type=\"uint16\" --set data.path=\"$out/docs.bin\" --set data.packing=\"documents\" --set data.eos_id=1"
configs=(
  "naive            |1|1024 |$N"
  "naive            |1|2048 |$N"
  "naive+loss       |1|2048 |$N $L"
  "naive+loss+mlp   |1|4096 |$N $L $T"
  "chunk            |1|4096 |$C"
  "chunk+loss       |1|8192 |$C $L"
  "chunk+loss+mlp   |1|16384|$C $L $T"
  "naive            |2|2048 |$N"
  "naive+loss       |4|4096 |$N $L"
  "chunk+loss+mlp   |2|16384|$C $L $T"
  "chunk+loss+mlp   |4|16384|$C $L $T"
  "zero3 chunk+loss |1|8192 |$C $L $Z"
  "zero3+SO all     |2|16384|$C $L $T $Z $SO"
  "fused            |1|4096 |$F"
  "fused+loss       |1|16384|$F $L"
  "fused+loss+mlp   |4|16384|$F $L $T"
  "zero3+SO fused   |2|16384|$F $L $T $Z $SO"
  "naive unfused    |1|2048 |$N $U"
  "chunk+loss unfused|1|8192 |$C $L $U"
  "ring4 fused+loss+mlp|4|16384|$F $L $T --set sequence_parallel_ring_degree=4"
  "U2xR2 fused+loss+mlp|4|16384|$F $L $T --set sequence_parallel_ring_degree=2"
  "fused bf16       |1|4096 |$F $B"
  "fused+loss bf16  |1|16384|$F $L $B"
  "fused+loss+mlp bf16|4|16384|$F $L $T $B"
  "deep16 fused+loss+mlp|1|8192 |$F $L $T $D16"
  "deep16 +disk offload|1|8192 |$F $L $T $D16 $OFF"
  "zero1 fused+loss+mlp|2|8192 |$F $L $T $Z1"
  "zero2 fused+loss+mlp|2|8192 |$F $L $T $Z2"
  "zero3 fused+loss+mlp|2|8192 |$F $L $T $Z"
  "zero0+SO fused+loss+mlp|1|8192 |$F $L $T $SO"
  "zero1+SO fused+loss+mlp|2|8192 |$F $L $T $Z1 $SO"
  "zero2+SO fused+loss+mlp|2|8192 |$F $L $T $Z2 $SO"
  "packed fused+loss+mlp|1|8192 |$F $L $T $PK"
  "fused head, whole logits|1|8192 |$F $T"
  "deep32 fused+loss+mlp|1|16384|$F $L $T $D32"
  "deep32 +disk offload|1|16384|$F $L $T $D32 $OFF"
)
printf "| %-3s | %-18s | %2s | %7s | %13s | %12s | %7s |\n" row config P seq_len predicted_MiB measured_MiB error
printf "|%s|%s|%s|%s|%s|%s|%s|\n" ----- -------------------- ---- --------- --------------- -------------- ---------
i=0
for row in "${configs[@]}"; do
  IFS='|' read -r name P S flags <<<"$row"
  S=$(echo $S); i=$((i + 1))
  if [ -n "$ROWS" ] && ! [[ " $ROWS " == *" $i "* ]]; then continue; fi
  args="--nproc $P --set sequence_parallel_size=$P --set data.seq_len=$S --set train.threads=$THREADS $flags"
  if [ -n "$BUDGET" ]; then args="$args --set train.memory_budget=\"$BUDGET\""; fi
  pred=$($BIN plan "$CFG" $args | awk '$1 == "total" {print $2}')
  if [ "$REUSE" != 1 ] || ! [ -s "$out/$i.jsonl" ]; then
    $BIN train "$CFG" $args --metrics "$out/$i.jsonl" >"$out/$i.log" 2>&1 || { echo "run $i failed:"; tail "$out/$i.log"; exit 1; }
  fi
  meas=$(python3 -c "import json,sys; print(max(json.loads(l)['peak_rss_bytes'] for l in open(sys.argv[1])) / 2**20)" "$out/$i.jsonl")
  python3 -c "
import sys
i, n, P, S, p, m = sys.argv[1:7]; p, m = float(p), float(m)
print(f'| {i:>3} | {n.strip():<18} | {P:>2} | {S:>7} | {p:>13.1f} | {m:>12.1f} | {100 * (p - m) / m:>+6.1f}% |')" "$i" "$name" "$P" "$S" "$pred" "$meas"
done
