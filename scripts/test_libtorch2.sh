#!/usr/bin/env bash
# The whole suite against libtorch 2.6: builds into build-libtorch2/ inside the Debian 13 root of
# scripts/debian13_root.sh and runs it there exactly as scripts/test.sh does on the host.
# The one non-obvious decision: the checkout, the ccache and the tokenizer fixtures are bound at
# their host paths, so LONGTRAIN_SOURCE_DIR, the build folder and CCACHE_BASEDIR mean the same
# inside and out; the ccache is a folder of its own (libtorch 2.6's objects never hit for 1.13's,
# and would only push them out of the host's cache).
set -euo pipefail
cd "$(dirname "$0")/.."
CCACHE_DIR="${LONGTRAIN_CCACHE2_DIR:-$HOME/.cache/longtrain/ccache-libtorch2}"
NPM_DIR="${LONGTRAIN_NPM_DIR:-$HOME/.cache/longtrain/npm}"
mkdir -p "$CCACHE_DIR" "$NPM_DIR"
export CCACHE_DIR LONGTRAIN_NPM_DIR="$NPM_DIR" LONGTRAIN_BUILD_DIR=build-libtorch2
export CCACHE_BASEDIR="$PWD"
exec bash scripts/debian13_root.sh --bind "$PWD" --bind "$CCACHE_DIR" --bind "$NPM_DIR" -- \
  bash scripts/test.sh
