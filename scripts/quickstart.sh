#!/usr/bin/env bash
# Quick start: install, build, and train the embedded default (examples/quickstart.json).
# Extra arguments go to `longtrain train`, e.g. --set train.steps=100.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh longtrain
exec ./build/longtrain train examples/quickstart.json "$@"
