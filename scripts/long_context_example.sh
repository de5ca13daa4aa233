#!/usr/bin/env bash
# The long-context example: repository-level documents (each directory of the libstdc++ headers,
# which build-essential installs, concatenated), a base model trained at 256 tokens, extended with
# YaRN (factor 8) and trained at 2048 tokens with SP 2, and both evaluated on held-out directories:
# the loss by position at 2048 and a passkey grid. Everything lands in runs/long/ (OUT=... moves
# it); the last lines print the tables the README shows.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
OUT="${OUT:-runs/long}"
LT=./build/longtrain
mkdir -p "$OUT/docs/train" "$OUT/docs/eval"
rm -rf "$OUT"/*_ckpt "$OUT"/*_hf "$OUT"/docs/train/* "$OUT"/docs/eval/*
ROOT="$(find /usr/include/c++ -mindepth 1 -maxdepth 1 -type d | sort -V | tail -1)"
# One document per directory: its files in name order, each after a "// file:" line.
for dir in $(find "$ROOT" -type d | sort); do
  name=$(echo "${dir#"$ROOT"}" | tr / _); name="${name:-_top}"
  case "$dir" in */experimental*|*/tr1*) split=eval ;; *) split=train ;; esac
  find "$dir" -maxdepth 1 -type f | sort | while read -r f; do echo "// file: ${f#"$ROOT"/}"; cat "$f"; done \
    > "$OUT/docs/$split/$name.txt"
done
find "$OUT/docs" -name '*.txt' -size 0 -delete
$LT tokenize --train-tokenizer 4096 --tokenizer-type bpe --tokenizer "$OUT/tokenizer.model" \
  --out "$OUT/train.bin" "$OUT"/docs/train/*.txt
$LT tokenize --tokenizer "$OUT/tokenizer.model" --out "$OUT/eval.bin" "$OUT"/docs/eval/*.txt
# The base model at 256 tokens, exported as a Hugging Face directory.
$LT train examples/long_context_base.json --set "data.path=$OUT/train.bin" \
  --set "train.checkpoint.dir=$OUT/base_ckpt" --metrics "$OUT/base.jsonl"
$LT export "$OUT/base_ckpt" --out "$OUT/base_hf"
# Extended: YaRN factor 8 over the base's weights, trained at 2048 tokens on 2 SP ranks.
$LT train examples/long_context_extend.json --set "model.init_from=$OUT/base_hf" --set "data.path=$OUT/train.bin" \
  --set "train.checkpoint.dir=$OUT/extended_ckpt" --metrics "$OUT/extended.jsonl"
$LT export "$OUT/extended_ckpt" --out "$OUT/extended_hf"
# The base with YaRN and no training at the new length: what the rope change alone does.
cp -r "$OUT/base_hf" "$OUT/base_yarn_hf"
sed -i 's/"rope_scaling": null/"rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256}/' \
  "$OUT/base_yarn_hf/config.json"
for m in base base_yarn extended; do
  $LT eval "$OUT/${m}_hf" --data "$OUT/eval.bin" --seq-len 2048 --windows "${WINDOWS:-24}" --json > "$OUT/$m.eval.json"
  $LT eval "$OUT/${m}_hf" --needle --lengths 256,512,1024,2048 --depths 0,0.25,0.5,0.75,1 --trials "${TRIALS:-4}" \
    --out "$OUT/$m.needle.svg" --json > "$OUT/$m.needle.json"
done
echo "--- loss by position at 2048 tokens (held-out directories), base / base + YaRN / extended:"
python3 - "$OUT" <<'PY' 2>/dev/null || cat "$OUT"/*.eval.json
import json, sys
out = sys.argv[1]
runs = {m: json.load(open(f"{out}/{m}.eval.json")) for m in ("base", "base_yarn", "extended")}
print("| positions | base | base + YaRN | extended |")
print("|---|---|---|---|")
for i, (s, e, _) in enumerate(runs["base"]["loss_by_position"]):
    print(f"| [{s}, {e}) | " + " | ".join(f"{runs[m]['loss_by_position'][i][2]:.3f}" for m in runs) + " |")
print("| all | " + " | ".join(f"{runs[m]['loss']:.3f}" for m in runs) + " |")
for m in runs:
    n = json.load(open(f"{out}/{m}.needle.json"))["needle"]
    print(f"needle {m}: mean accuracy {sum(c[2] for c in n) / len(n):.2f} over {len(n)} cells")
PY
