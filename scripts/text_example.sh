#!/usr/bin/env bash
# The real-corpus example: installs Debian's `fortunes` (public-domain quotations, '%'-separated),
# trains a SentencePiece tokenizer on it, tokenizes it as packed documents, trains
# examples/text.json for a few minutes, generates a sample and plots the curves. Everything
# lands in runs/text/ (OUT=... to move it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if ! dpkg-query -W -f='${Status}' fortunes 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends fortunes
fi
OUT="${OUT:-runs/text}"
mkdir -p "$OUT"
rm -rf "$OUT/ckpt" "$OUT/metrics.jsonl"
mapfile -t FILES < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
./build/longtrain tokenize --train-tokenizer 4096 --tokenizer "$OUT/tokenizer.model" --split-on '%\n' \
  --out "$OUT/fortunes.bin" "${FILES[@]}"
./build/longtrain train examples/text.json --set "data.path=$OUT/fortunes.bin" \
  --set "data.tokenizer=$OUT/tokenizer.model" --set "train.checkpoint.dir=$OUT/ckpt" --metrics "$OUT/metrics.jsonl"
echo "--- sample (temperature 0.8, top-k 40):"
./build/longtrain generate "$OUT/ckpt" --prompt "The secret of" --max-new-tokens 60 --temperature 0.8 --top-k 40
./build/longtrain export "$OUT/ckpt" --out "$OUT/hf"
./build/longtrain plot "$OUT/metrics.jsonl" --out "$OUT/curves.svg"
