#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), then configures and builds into build/
# (LONGTRAIN_BUILD_DIR: another build folder, e.g. scripts/test_libtorch2.sh's).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# Paths under the checkout hash relative, so another worktree of the repository hits the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
# -g makes ccache hash the build folder's absolute path (hash_dir) unless told not to: without
# this, a clone elsewhere (CI's checkout, another worktree) missed on every file. The cost: a hit's
# debug info names the folder that compiled it first.
export CCACHE_NOHASHDIR=true
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
BUILD_DIR="${LONGTRAIN_BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${LONGTRAIN_CMAKE_ARGS:-} >/dev/null
ninja -C "$BUILD_DIR" -j "${LONGTRAIN_JOBS:-2}" "$@"
