#!/usr/bin/env bash
# bench/max_seq_peer.sh: the comparison a user makes. The longest seq_len (micro batch 1) whose training steps fit a
# per-rank memory budget, for one Llama (bench/max_seq_peer.json: 19.3M parameters, vocab 32000), longtrain against
# the peer a user would otherwise run: PyTorch 2.6 (Debian 13's python3-torch, in scripts/debian13_root.sh's root)
# with SDPA, per-block activation checkpointing (use_reentrant=False), fp32, fused AdamW, tcmalloc
# (bench/e2e_torch.py, the model bench/e2e.sh times). Fits: VmHWM of 2 steps (forward, backward, AdamW; the second
# holds Adam's state) <= the budget. longtrain's length is `plan --max-seq`'s, trained at once to measure it; the
# peer's is searched (bench/max_seq_peer.py: the line through measured peaks, then bisection to STEP tokens), each
# candidate a fresh process that a watchdog stops when it passes the budget. Peer variants: plain (whole logits, as
# PyTorch users write it) and chunked (head + loss in LOSS_CHUNK-token tiles, each recomputed: not stock PyTorch).
# Every run checks itself: finite losses, the first within 10% of ln(32000), the peer's parameter count longtrain's.
# Time (2 loaded Zen 2 cores): longtrain ~6 min a step at 29K tokens (1 GiB) and ~S^2 beyond, so it trains only
# plan lengths up to LT_MAX_SEQ; the peer ~1-7 min a candidate up to PEER_MAX_SEQ; past those the table gives
# the plan's length and the peer's line, marked not run. About 1 h with the defaults.
# Usage: [BUDGETS="768MiB 1GiB 2GiB 4GiB 8GiB"] [BIN=build/longtrain] [VARIANTS="plain chunked"] [STEP=256]
#        [LT_MAX_SEQ=30000] [PEER_MAX_SEQ=24576] [LOSS_CHUNK=256] [ALLOC=tcmalloc|glibc] [TIMEOUT_S=1800]
#        [OUT=dir [REUSE=1: take the runs already there]] bash bench/max_seq_peer.sh (root: the Debian 13 root needs it).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longtrain}
OUT=${OUT:-$(mktemp -d /tmp/longtrain_max_seq.XXXX)}
[[ -x $BIN ]] || { echo "max_seq_peer: $BIN not found; build longtrain first (this script does not build it)" >&2; exit 1; }
mkdir -p "$OUT"
echo "## machine"
lscpu | grep -E '^(Model name|CPU family|Model):' | sed 's/  */ /g'
echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB, " $7 " GiB available"}'); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "longtrain: $BIN (this checkout: $(git log -1 --format=%h 2>/dev/null || echo "?")); results: $OUT"
nice -n "${NICE:-10}" /usr/bin/python3 bench/max_seq_peer.py --bin "$BIN" --out "$OUT" \
  --budgets "${BUDGETS:-768MiB 1GiB 2GiB 4GiB 8GiB}" --variants "${VARIANTS:-plain chunked}" --step "${STEP:-256}" \
  --lt-max-seq "${LT_MAX_SEQ:-30000}" --peer-max-seq "${PEER_MAX_SEQ:-24576}" --loss-chunk "${LOSS_CHUNK:-256}" \
  --alloc "${ALLOC:-tcmalloc}" --timeout-s "${TIMEOUT_S:-1800}" \
  $([[ ${REUSE:-0} == 1 ]] && echo --reuse) | tee "$OUT/table.md"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
