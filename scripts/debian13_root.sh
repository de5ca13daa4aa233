#!/usr/bin/env bash
# A Debian 13 (trixie) root with longtrain's build dependencies (libtorch 2.6), made with
# debootstrap from Debian's packages only and kept outside the checkout, so the second run costs
# seconds. Optionally runs a command inside it.
#   debian13_root.sh [--python-torch] [--bind DIR]... [-- COMMAND...]
#     --python-torch  also installs python3-torch (PyTorch 2.6 for the benchmarks) and
#                     python3-setuptools (torch.compile's inductor imports it to build kernels)
#     --bind DIR      makes the host's DIR visible at the same path inside the root
#     COMMAND         runs inside the root as root, in the current directory's path
# Environment: LONGTRAIN_DEBIAN13_ROOT (default /var/cache/longtrain/debian13);
# LONGTRAIN_DEBIAN13_TARBALL: a .tar.zst of the root, unpacked when the root is missing and
# written when it is (a cache that survives deleting the root, e.g. on CI).
# The one non-obvious decision: everything runs in a private mount namespace (unshare -m), so
# /proc, /dev, /sys, /run and the binds vanish with the process even on SIGKILL, never show on
# the host, and two runs (or the host's own two-host tests) cannot see each other's network
# namespaces under /run/netns. The trap unmounts as well, for a clean exit in any case.
set -euo pipefail
ROOT="${LONGTRAIN_DEBIAN13_ROOT:-/var/cache/longtrain/debian13}"
TARBALL="${LONGTRAIN_DEBIAN13_TARBALL:-}"
MIRROR="http://deb.debian.org/debian"
SCRIPTS="$(cd "$(dirname "$0")" && pwd)"
# scripts/setup.sh's list under trixie's names (the same names: checked with apt-cache policy),
# plus npm for the tokenizer fixtures.
PKGS=(build-essential cmake ninja-build ccache pkg-config
      libtorch-dev libgloo-dev libopenblas0-openmp libgoogle-perftools-dev libdnnl-dev
      nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libsentencepiece-dev
      libpcre2-dev libutf8proc-dev
      libgtest-dev libgmock-dev libbenchmark-dev iproute2 npm ca-certificates)

die() { echo "[debian13] error: $*" >&2; exit 1; }

python_torch=0 binds=() command=()
while (($#)); do
  case $1 in
    --python-torch) python_torch=1; shift ;;
    --bind) [ $# -ge 2 ] || die "--bind needs a directory"
            [ -d "$2" ] || die "--bind $2: no such directory (create it first)"
            binds+=("$(cd "$2" && pwd)"); shift 2 ;;
    --) shift; command=("$@"); break ;;
    *) die "unknown argument '$1' (usage: $0 [--python-torch] [--bind DIR]... [-- COMMAND...])" ;;
  esac
done
((python_torch)) && PKGS+=(python3-torch python3-setuptools)

require_host() {
  [ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mounts): run it with sudo"
  command -v unshare >/dev/null || die "needs unshare (Debian util-linux)"
  command -v zstd >/dev/null || [ -z "$TARBALL" ] || apt_host zstd
  command -v debootstrap >/dev/null || apt_host debootstrap
}

apt_host() {
  echo "[debian13] installing on the host: $*"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# The base system: from the tarball when there is one, else debootstrap into ROOT.partial and
# rename, so an interrupted run never leaves a half root that looks finished.
ensure_base() {
  [ -e "$ROOT/.longtrain-base" ] && return
  mkdir -p "$(dirname "$ROOT")"
  rm -rf "$ROOT.partial"
  if [ -n "$TARBALL" ] && [ -f "$TARBALL" ]; then
    echo "[debian13] unpacking $TARBALL"
    mkdir -p "$ROOT.partial"
    tar -C "$ROOT.partial" --zstd -xpf "$TARBALL"
  else
    echo "[debian13] debootstrap trixie into $ROOT (a few minutes, once)"
    debootstrap --variant=minbase trixie "$ROOT.partial" "$MIRROR" >/dev/null
    printf '#!/bin/sh\n# No services start inside this build root.\nexit 101\n' > "$ROOT.partial/usr/sbin/policy-rc.d"
    chmod +x "$ROOT.partial/usr/sbin/policy-rc.d"
    touch "$ROOT.partial/.longtrain-base"
  fi
  rm -rf "$ROOT"
  mv "$ROOT.partial" "$ROOT"
}

# The kernel file systems, a fresh /run, and the binds (inside the private namespace).
mount_all() {
  # The root a mount point of its own: `ip netns add` runs `mount --make-rslave /`, which fails
  # (EINVAL) in a chroot whose / is a plain folder, and the two-host tests then skip.
  mount --bind "$ROOT" "$ROOT"
  mount -t proc proc "$ROOT/proc"
  mount --rbind /dev "$ROOT/dev"
  mount --rbind /sys "$ROOT/sys"
  mount -t tmpfs -o mode=755 tmpfs "$ROOT/run"
  mkdir -p "$ROOT/run/netns" "$ROOT/run/lock"
  cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
  local d
  for d in "${binds[@]}"; do
    mkdir -p "$ROOT$d"
    mount --bind "$d" "$ROOT$d"
  done
}

unmount_all() {
  local d
  for d in "${binds[@]}"; do umount -l "$ROOT$d" 2>/dev/null || true; done
  for d in run sys dev proc; do umount -l "$ROOT/$d" 2>/dev/null || true; done
  umount -l "$ROOT" 2>/dev/null || true
}

missing_packages() {
  local p
  for p in "${PKGS[@]}"; do
    chroot "$ROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

install_packages() {
  local missing
  mapfile -t missing < <(missing_packages)
  ((${#missing[@]})) || return 0
  echo "[debian13] installing in the root: ${missing[*]}"
  chroot "$ROOT" apt-get update -qq
  chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  chroot "$ROOT" apt-get clean
}

write_tarball() {
  [ -n "$TARBALL" ] && [ ! -f "$TARBALL" ] || return 0
  echo "[debian13] writing $TARBALL"
  mkdir -p "$(dirname "$TARBALL")"
  tar -C "$ROOT" --zstd --one-file-system -cpf "$TARBALL.partial" .
  mv "$TARBALL.partial" "$TARBALL"
}

# Inside the private mount namespace: mount, install what is missing, run the command.
inside() {
  trap unmount_all EXIT
  mount --make-rprivate /
  mount_all
  install_packages
  if ((${#command[@]})); then
    local dir="$PWD"
    [ -d "$ROOT$dir" ] || dir=/
    chroot "$ROOT" env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM="${TERM:-dumb}" \
      "${passed_env[@]}" bash -c 'cd "$1" && shift && exec "$@"' _ "$dir" "${command[@]}"
  fi
}

# Variables the command inside sees (CI, CCACHE_*, LONGTRAIN_*), passed as NAME=value.
passed_env=()
while IFS='=' read -r name _; do
  [[ $name =~ ^(CI|CCACHE_[A-Z_]+|LONGTRAIN_[A-Z0-9_]+)$ && $name != LONGTRAIN_DEBIAN13_* ]] &&
    passed_env+=("$name=${!name}")
done < <(env)

if [ "${LONGTRAIN_DEBIAN13_INSIDE:-}" = 1 ]; then
  inside
  exit
fi
require_host
ensure_base
args=()
((python_torch)) && args+=(--python-torch)
for d in "${binds[@]}"; do args+=(--bind "$d"); done
((${#command[@]})) && args+=(-- "${command[@]}")
LONGTRAIN_DEBIAN13_INSIDE=1 unshare --mount --propagation private -- bash "$SCRIPTS/debian13_root.sh" "${args[@]}"
write_tarball
