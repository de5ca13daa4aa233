#!/usr/bin/env bash
# Install, build everything, and run the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd "${LONGTRAIN_BUILD_DIR:-build}"
ctest --output-on-failure -j "${LONGTRAIN_JOBS:-2}" --timeout 600
