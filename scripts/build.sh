#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), then configures and builds into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# Paths under the checkout hash relative, so another worktree of the repository hits the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${LONGTRAIN_CMAKE_ARGS:-} >/dev/null
ninja -C build -j "${LONGTRAIN_JOBS:-2}" "$@"
