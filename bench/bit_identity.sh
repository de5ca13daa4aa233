#!/usr/bin/env bash
# bench/bit_identity.sh: the per-step losses, gradient norms and accuracies of a fixed matrix of
# short runs (the quick start, the e2e shapes, every ZeRO stage, SuperOffload, bf16 copies,
# accumulation, clipping, recompute, DeepCompile), exact to the last bit, so a refactor can show
# it changed no number. Non-obvious: the values are the metrics file's round-trip doubles, and
# each case prints one line: its name and a SHA-256 of its rows (then a diff says which changed).
# Usage: [BIN=...] bench/bit_identity.sh [OUT.txt]   (after scripts/build.sh); compare two OUT files with diff.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longtrain}
[[ -x $BIN ]] || { echo "bit_identity: $BIN not found; run scripts/build.sh first" >&2; exit 1; }
OUT=${1:-/dev/stdout}
TMP=$(mktemp -d /tmp/longtrain_bits.XXXX)
trap 'rm -rf "$TMP"' EXIT

DP2="--nproc 2 --set sequence_parallel_size=1 --set train.threads=1 --set train.eval_every=0"
cases=(
  "quickstart|examples/quickstart.json --set train.steps=60 --set train.eval_every=30"
  "e2e_quickstart|bench/e2e_quickstart.json --set train.steps=20"
  "e2e_medium|bench/e2e_medium.json --set train.steps=6"
  "e2e_long|bench/e2e_long.json --set train.steps=3"
  "dp2_stage0|examples/quickstart.json $DP2 --set train.steps=20"
  "dp2_stage0_accum_clip|examples/quickstart.json $DP2 --set train.steps=12 --set gradient_accumulation_steps=2 --set gradient_clipping=0.05"
  "dp2_stage1|examples/quickstart.json $DP2 --set train.steps=20 --set zero_optimization.stage=1"
  "dp2_stage2|examples/quickstart.json $DP2 --set train.steps=20 --set zero_optimization.stage=2 --set gradient_clipping=0.05"
  "dp2_stage3|examples/quickstart.json $DP2 --set train.steps=20 --set zero_optimization.stage=3"
  "dp2_stage3_superoffload|examples/quickstart.json $DP2 --set train.steps=12 --set zero_optimization.stage=3 --set zero_optimization.offload_optimizer.device=\"cpu\" --set zero_optimization.offload_optimizer.super_offload=true --set gradient_clipping=0.05"
  "dp2_stage3_bf16|examples/quickstart.json $DP2 --set train.steps=8 --set zero_optimization.stage=3 --set bf16.enabled=true --set bf16.only_if_faster=false"
  "dp2_stage0_bf16|examples/quickstart.json $DP2 --set train.steps=8 --set bf16.enabled=true --set bf16.only_if_faster=false"
  "sp2_recompute_all|examples/quickstart.json --set train.steps=12 --set activation_checkpointing=\"all\" --set train.eval_every=0"
  "sp2_stage3_deepcompile|examples/quickstart.json --set train.steps=12 --set zero_optimization.stage=3 --set compile.deepcompile=true --set train.eval_every=0"
)

lscpu | grep -E '^(Model name|CPU family|Model):' | sed 's/  */ /g' >&2
for c in "${cases[@]}"; do
  name=${c%%|*}
  args=${c#*|}
  eval "set -- $args"
  if ! "$BIN" train "$@" --metrics "$TMP/$name.jsonl" >"$TMP/$name.log" 2>&1; then
    echo "bit_identity: case $name failed:" >&2
    tail -5 "$TMP/$name.log" >&2
    echo "$name FAILED"
    continue
  fi
  rows=$(grep -o '"grad_norm":[^,}]*\|"loss":[^,}]*\|"train_accuracy":[^,}]*\|"eval_[a-z]*":[^,}]*' "$TMP/$name.jsonl")
  echo "$name $(sha256sum <<<"$rows" | cut -c1-16) steps=$(wc -l <"$TMP/$name.jsonl") values=$(wc -l <<<"$rows")"
done | tee "$TMP/summary" >&2
[[ $OUT == /dev/stdout ]] || cp "$TMP/summary" "$OUT"
