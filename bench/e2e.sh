#!/usr/bin/env bash
# bench/e2e.sh: end-to-end training tokens/s, longtrain fp32 and bf16 against two PyTorch peers running the same model
# (bench/e2e_torch.py): 1.13 eager on the host, and 2.6 in scripts/debian13_root.sh's Debian 13 root (SDPA, fused
# AdamW, tcmalloc; eager and torch.compile; fp32 and bf16 autocast), the best 2.6 variant per precision in the table.
# Non-obvious: a 2.6 bf16 variant runs only where PyTorch's bf16 GEMM rate, measured first, predicts a step under
# BF16_MAX_STEP_S (without AVX512_BF16 its bf16 matmul runs ~50x below fp32); the table then says so and compares
# longtrain bf16 with the best 2.6 variant of any precision. Every run checks its own result (loss and parameters).
# Usage: [SHAPES="quickstart medium long long16k wide"] [STEPS=N] [WARMUP=N] [BUDGET_S=60] [BF16_MAX_STEP_S=10]
#        [LONGTRAIN_BIN=build/longtrain] [PEER113="default tuned"] [PEER26="sdpa_gqa sdpa sdpa_spin compile compile_spin sdpa_bf16 compile_bf16"]
#        bash bench/e2e.sh (root). Variants: sdpa_gqa (enable_gqa), sdpa (K/V repeated: the flash kernel), compile
#        (torch.compile), *_spin (GOMP_SPINCOUNT=10000, as longtrain train sets), *_bf16 (bf16 autocast).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LONGTRAIN_BIN:-./build/longtrain}
PY=/usr/bin/python3
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4  # the same path on the host and in the Debian 13 root
read -r -a shapes <<<"${SHAPES:-quickstart medium long long16k wide}"
read -r -a peer113 <<<"${PEER113-default tuned}"
read -r -a peer26 <<<"${PEER26-sdpa_gqa sdpa sdpa_spin compile compile_spin sdpa_bf16 compile_bf16}"
BUDGET_S=${BUDGET_S:-60}
BF16_MAX_STEP_S=${BF16_MAX_STEP_S:-10}
NAIVE_MAX_GIB=${NAIVE_MAX_GIB:-2}  # one [B, H, S, S] fp32 score tensor; the naive and math paths hold ~3 per block
T0=$SECONDS

[[ -x $BIN ]] || { echo "e2e: $BIN not found; build longtrain first (this script does not build it)" >&2; exit 1; }
((${#shapes[@]})) || { echo "e2e: SHAPES is empty" >&2; exit 1; }
for s in "${shapes[@]}"; do [[ -f bench/e2e_$s.json ]] || { echo "e2e: no config bench/e2e_$s.json (SHAPES=${shapes[*]})" >&2; exit 1; }; done

TMP=$(mktemp -d /tmp/longtrain_e2e.XXXX)

# Debian packages only (never pip): python3-torch 1.13 for the 1.13 peer, tcmalloc for its tuned env.
need=()
$PY -c 'import torch' 2>/dev/null || need+=(python3-torch)
[[ -e $TCMALLOC ]] || need+=(libgoogle-perftools-dev)
if ((${#need[@]})); then
  SUDO=; ((EUID == 0)) || SUDO=sudo
  echo "e2e: installing ${need[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y --no-install-recommends "${need[@]}" >"$TMP/apt.log" 2>&1 ||
    { $SUDO apt-get update >>"$TMP/apt.log" 2>&1 && $SUDO apt-get install -y --no-install-recommends "${need[@]}" >>"$TMP/apt.log" 2>&1; } ||
    { cat "$TMP/apt.log" >&2; exit 1; }
fi

root26() { bash scripts/debian13_root.sh --python-torch --bind "$PWD" -- env LD_PRELOAD="$TCMALLOC" "$@"; }
echo "## machine"
lscpu | grep -E '^(Model name|CPU family|Model):' | sed 's/  */ /g'
echo "AVX512_BF16: $(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
blas_core() { local out; out=$(OPENBLAS_VERBOSE=2 "$@" 2>&1 || true); grep -m1 '^Core:' <<<"$out" || echo '? (no Core: line)'; }
echo "OpenBLAS core, longtrain: $(blas_core $BIN --help)"
echo "OpenBLAS core, torch 1.13 default env: $(blas_core $PY -c 'import torch')"
((${#peer26[@]})) && echo "torch 2.6 (Debian 13 root, tcmalloc): $(root26 sh -c 'OPENBLAS_VERBOSE=2 python3 -c "import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability())" 2>&1 | tr "\n" " "')"
echo "default env: LD_PRELOAD=${LD_PRELOAD:-<unset>} OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>} OMP_NUM_THREADS=${OMP_NUM_THREADS:-<unset>}"
echo "results: $TMP"

# Config -> torch flags, steps, warm-up (a comment-stripping JSON read: longtrain allows // comments).
shape_args() {
  $PY - "$1" "${STEPS:-}" "${WARMUP:-}" <<'PY'
import json, re, sys
path, steps, warm = sys.argv[1:]
c = json.loads("\n".join(l for l in open(path) if not re.match(r"\s*//", l)))
m, d, t = c["model"], c["data"], c["train"]
steps = int(steps) if steps else t["steps"]
warm = int(warm) if warm else (3 if steps >= 20 else 2 if steps >= 6 else 1)
warm = max(0, min(warm, steps - 1))
print(f"--hidden {m['hidden_size']} --layers {m['num_layers']} --heads {m['num_heads']} "
      f"--kv-heads {m.get('num_kv_heads', m['num_heads'])} --intermediate {m['intermediate_size']} "
      f"--vocab {m['vocab_size']} --seq {d['seq_len']} --batch {c['train_micro_batch_size_per_gpu']} "
      f"--threads {t['threads']} --steps {steps} --warmup {warm}")
PY
}
arg() { sed -E "s/.*--$1 ([0-9]+).*/\1/" <<<"$2"; }

fail() { echo "e2e: $1 failed:" >&2; cat "$2" "$2.err" >&2 2>/dev/null || true; exit 1; }

# torch_run OUT.json VERSION [env assignments...] -- [flags...]: one peer run; its own checks fail the script.
torch_run() {
  local out=$1 version=$2; shift 2
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  if [[ $version == 1.13 ]]; then
    env "${envs[@]}" $PY bench/e2e_torch.py --budget-s "$BUDGET_S" "$@" >"$out" 2>"$out.err" || fail "torch 1.13 $*" "$out"
  else
    root26 "${envs[@]}" python3 bench/e2e_torch.py --budget-s "$BUDGET_S" "$@" >"$out" 2>"$out.err" ||
      fail "torch 2.6 $* (env: ${envs[*]:-tcmalloc})" "$out"
  fi
}

# skip OUT.json REASON: a variant not run, with why.
skip() { printf '{"skipped": "%s"}\n' "$2" >"$1"; echo "  skipped $(basename "$1" .json): $2"; }

# longtrain_run SHAPE PRECISION STEPS: longtrain on the shape's config; fp32, or bf16.enabled (resolved at start).
longtrain_run() {
  local s=$1 p=$2 steps=$3 extra=()
  [[ $p == bf16 ]] && extra=(--set bf16.enabled=true)
  $BIN train "bench/e2e_$s.json" --set train.steps="$steps" "${extra[@]}" --metrics "$TMP/$s.lt_$p.jsonl" \
    >"$TMP/$s.lt_$p.log" 2>&1 || fail "longtrain ($p) on bench/e2e_$s.json" "$TMP/$s.lt_$p.log"
  grep -E '^longtrain: (bf16|model)' "$TMP/$s.lt_$p.log" | sed "s/^/  [$p] /" || true
}

# PyTorch 2.6's bf16 and fp32 GEMM rates (512^3, best of 5), for the bf16 variants' step estimate.
bf16_rate=0 fp32_rate=0
if [[ " ${peer26[*]} " == *_bf16* ]]; then
  root26 python3 bench/e2e_torch.py --gemm-peak bf16 --gemm-n 512 >"$TMP/gemm26_bf16.json" || fail "torch 2.6 bf16 GEMM" "$TMP/gemm26_bf16.json"
  root26 python3 bench/e2e_torch.py --gemm-peak fp32 --gemm-n 512 >"$TMP/gemm26_fp32.json" || fail "torch 2.6 fp32 GEMM" "$TMP/gemm26_fp32.json"
  bf16_rate=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["gemm_peak_flops"])' "$TMP/gemm26_bf16.json")
  fp32_rate=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["gemm_peak_flops"])' "$TMP/gemm26_fp32.json")
  echo "torch 2.6 GEMM 512^3: bf16 $($PY -c "print(f'{$bf16_rate/1e9:.1f}')") GFLOP/s, fp32 $($PY -c "print(f'{$fp32_rate/1e9:.1f}')") GFLOP/s"
fi

for s in "${shapes[@]}"; do
  read -r -a args <<<"$(shape_args "bench/e2e_$s.json")"
  line="${args[*]}"
  steps=$(arg steps "$line") warm=$(arg warmup "$line")
  B=$(arg batch "$line") H=$(arg heads "$line") S=$(arg seq "$line")
  echo "## $s: $line"
  longtrain_run "$s" fp32 "$steps"
  longtrain_run "$s" bf16 "$steps"
  # The core longtrain chose, if it says; else the tuned env leaves OPENBLAS_CORETYPE as it is.
  core=$(grep -oiE 'blas .*core[= ]([A-Za-z0-9]+)' "$TMP/$s.lt_fp32.log" | head -1 | sed -E 's/.*[Cc][Oo][Rr][Ee][= ]//' || true)
  scores_gib=$($PY -c "print($B * $H * $S * $S * 4 / 2**30)")
  too_big=$($PY -c "print(int($scores_gib > $NAIVE_MAX_GIB))")
  big_why="[B, H, S, S] scores of $($PY -c "print(f'{$scores_gib:.1f}')") GiB a block > NAIVE_MAX_GIB=$NAIVE_MAX_GIB"
  for v in "${peer113[@]}"; do
    out="$TMP/$s.t113_$v.json"
    ((too_big)) && { skip "$out" "naive attention: $big_why"; continue; }
    envs=()
    [[ $v == tuned* ]] && envs=(LD_PRELOAD="$TCMALLOC" ${core:+OPENBLAS_CORETYPE="$core"})
    flags=()
    [[ $v == *_ckpt ]] && flags=(--checkpoint)
    torch_run "$out" 1.13 "${envs[@]}" -- "${args[@]}" "${flags[@]}"
  done
  fpt=$($PY -c "import sys; sys.path.insert(0, 'bench'); from e2e_torch import flops_per_token as f
print(f($(arg hidden "$line"), $(arg layers "$line"), $H, $(arg kv-heads "$line"), $(arg intermediate "$line"), $(arg vocab "$line"), $S))")
  for v in "${peer26[@]}"; do
    out="$TMP/$s.t26_$v.json"
    flags=(--fused-adamw)
    case $v in
      sdpa_gqa) ((too_big)) && { skip "$out" "enable_gqa takes SDPA's math path: $big_why"; continue; }
                flags+=(--attention sdpa_gqa) ;;
      *) flags+=(--attention sdpa) ;;
    esac
    [[ $v == compile* ]] && flags+=(--compile --warmup $((warm > 2 ? warm : 2)))
    if [[ $v == *_bf16 ]]; then
      est=$($PY -c "print(f'{$fpt * $B * $S / max($bf16_rate, 1):.1f}')")
      if $PY -c "import sys; sys.exit(0 if $est > $BF16_MAX_STEP_S else 1)"; then
        skip "$out" "bf16 GEMMs alone estimated at $est s a step (model FLOPs / torch's bf16 GEMM rate) > BF16_MAX_STEP_S=$BF16_MAX_STEP_S"
        continue
      fi
      flags+=(--bf16)
    fi
    envs=()
    [[ $v == *_spin ]] && envs=(GOMP_SPINCOUNT=10000)  # what longtrain train sets for itself (docs/cli.md)
    torch_run "$out" 2.6 "${envs[@]}" -- "${args[@]}" "${flags[@]}"
  done
  echo "$s done at $((SECONDS - T0)) s"
done

$PY - "$TMP" "${shapes[@]}" <<'PY'
import glob, json, math, os, re, statistics, sys
d, shapes = sys.argv[1], sys.argv[2:]
rows, notes = [], []
pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"

def longtrain(s, p):
    """Median tokens/s after warm-up, and the run's own checks: finite loss, near ln(vocab) at start, falling."""
    m = [json.loads(l) for l in open(f"{d}/{s}.lt_{p}.jsonl")]
    warm = 3 if len(m) >= 20 else 2 if len(m) >= 6 else 1
    kept = [r for r in m if r["step"] > warm]
    vocab = json.loads("\n".join(l for l in open(f"bench/e2e_{s}.json") if not re.match(r"\s*//", l)))["model"]["vocab_size"]
    first, last = m[0]["loss"], m[-1]["loss"]
    if not all(math.isfinite(r["loss"]) for r in m) or abs(first - math.log(vocab)) > 0.1 * math.log(vocab) or not last < first:
        sys.exit(f"e2e: longtrain {p} on {s}: losses {first:.4f} -> {last:.4f} fail the checks (ln(vocab) {math.log(vocab):.4f})")
    log = open(f"{d}/{s}.lt_{p}.log").read()
    pm = re.search(r"model ([0-9.]+)M params", log)
    bf = re.search(r"bf16\.enabled: bf16 GEMM ([0-9.]+) GFLOP/s against fp32 \(\w+\) ([0-9.]+) .*: (.*)", log)
    resolved = "fp32"
    if bf:
        ran = "fp32" if "runs in fp32" in bf.group(3) else "bf16"
        resolved = f"ran {ran}: bf16 GEMM {bf.group(1)} vs fp32 {bf.group(2)} GFLOP/s"
    return {"tps": statistics.median(r["tokens_per_s"] for r in kept), "mfu": m[-1].get("mfu"), "loss": (first, last),
            "params_m": float(pm.group(1)) if pm else None, "resolved": resolved,
            "fpt": m[-1].get("model_flops_per_token")}

def peers(s):
    out = {}
    for f in sorted(glob.glob(f"{d}/{s}.t*_*.json")):
        name = os.path.basename(f)[len(s) + 1:-5].replace("t113_", "1.13 ").replace("t26_", "2.6 ")
        out[name] = json.load(open(f))
    return out

def best(ps, version, bf16):
    ran = {k: v for k, v in ps.items() if k.startswith(version) and "skipped" not in v and (bf16 is None or v["bf16"] == bf16)}
    return max(ran.items(), key=lambda kv: kv[1]["tokens_per_s"]) if ran else (None, None)

for s in shapes:
    f, b = longtrain(s, "fp32"), longtrain(s, "bf16")
    ps = peers(s)
    print(f"{s}: longtrain fp32 {f['tps']:.0f} tok/s (MFU {pct(f['mfu'])}, loss {f['loss'][0]:.4f} -> {f['loss'][1]:.4f}); "
          f"bf16 {b['tps']:.0f} tok/s ({b['resolved']}, loss {b['loss'][0]:.4f} -> {b['loss'][1]:.4f})")
    for k, v in ps.items():
        if "skipped" in v:
            print(f"  torch {k:18s} skipped: {v['skipped']}")
            continue
        if f["params_m"] is not None and abs(f["params_m"] * 1e6 - v["params"]) > 0.005e6 + 1:
            sys.exit(f"e2e: {s}: longtrain has {f['params_m']}M params, torch {k} {v['params']}")
        print(f"  torch {k:18s} step {v['median_step_s']:.4f} s {v['tokens_per_s']:9.0f} tok/s  loss {v['first_loss']:.4f} -> "
              f"{v['last_loss']:.4f}  first step {v['first_step_s']:.1f} s, {v['steps']} steps")
    n113, t113 = best(ps, "1.13", None)
    n32, t32 = best(ps, "2.6", False)
    n16, t16 = best(ps, "2.6", True)
    if t16 is None:
        n16, t16 = n32, t32
        n16 = f"{n16} (fp32: bf16 not run)" if n16 else None
    cell = lambda n, t: "-" if t is None else f"{t['tokens_per_s']:.0f} ({n.split(' ', 1)[1]})"
    ratio = lambda x, t: "-" if t is None else f"{x / t['tokens_per_s']:.2f}x"
    rows.append(f"| {s} | {f['tps']:.0f} | {b['tps']:.0f} ({b['resolved'].split(':')[0]}) | {cell(n113, t113)} | "
                f"{cell(n32, t32)} | {cell(n16, t16)} | {ratio(f['tps'], t113)} | **{ratio(f['tps'], t32)}** | "
                f"**{ratio(b['tps'], t16)}** |")
print()
print("| shape | longtrain fp32 tok/s | longtrain bf16 tok/s (resolved) | torch 1.13 best | torch 2.6 best fp32 | "
      "torch 2.6 best bf16 | fp32 x 1.13 | fp32 x 2.6 | bf16 x 2.6 |")
print("|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
PY
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg); total $((SECONDS - T0)) s"
