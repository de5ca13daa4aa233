#!/usr/bin/env bash
# bench/e2e.sh: end-to-end training tokens/s and MFU, longtrain vs PyTorch eager (bench/e2e_torch.py, the same model).
# Non-obvious: torch runs in the caller's env ("default") and in longtrain's allocator + OpenBLAS core ("tuned"), so the
# two ratios split runtime gains from BLAS/allocator gains. Usage: [SHAPES="quickstart medium long"] [STEPS=N] [WARMUP=N]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/longtrain
PY=/usr/bin/python3
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4
read -r -a shapes <<<"${SHAPES:-quickstart medium long}"
T0=$SECONDS

[[ -x $BIN ]] || { echo "e2e: $BIN not found; build longtrain first (this script does not build it)" >&2; exit 1; }
((${#shapes[@]})) || { echo "e2e: SHAPES is empty" >&2; exit 1; }
for s in "${shapes[@]}"; do [[ -f bench/e2e_$s.json ]] || { echo "e2e: no config bench/e2e_$s.json (SHAPES=${shapes[*]})" >&2; exit 1; }; done

TMP=$(mktemp -d /tmp/longtrain_e2e.XXXX)

# Debian packages only (never pip): python3-torch 1.13 for the baseline, tcmalloc for the tuned env.
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

echo "## machine"
lscpu | grep -E '^(Model name|CPU family|Model):' | sed 's/  */ /g'
blas_core() { local out; out=$(OPENBLAS_VERBOSE=2 "$@" 2>&1 || true); grep -m1 '^Core:' <<<"$out" || echo '? (no Core: line)'; }
echo "OpenBLAS core, longtrain: $(blas_core $BIN --help)"
echo "OpenBLAS core, torch default env: $(blas_core $PY -c 'import torch')"
echo "default env: LD_PRELOAD=${LD_PRELOAD:-<unset>} OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>} OMP_NUM_THREADS=${OMP_NUM_THREADS:-<unset>}"
echo "longtrain links tcmalloc: $(ldd "$BIN" | grep tcmalloc >/dev/null && echo yes || echo no)"  # no grep -q: under pipefail its early exit fails ldd
echo "results: $TMP"

# Config -> torch flags, steps, warm-up (a comment-stripping JSON read: longtrain allows // comments).
shape_args() {
  $PY - "$1" "${STEPS:-}" "${WARMUP:-}" <<'PY'
import json, re, sys
path, steps, warm = sys.argv[1:]
c = json.loads("\n".join(l for l in open(path) if not re.match(r"\s*//", l)))
m, d, t = c["model"], c["data"], c["train"]
steps = int(steps) if steps else t["steps"]
warm = int(warm) if warm else (3 if steps >= 20 else 2)
warm = max(0, min(warm, steps - 1))
print(f"--hidden {m['hidden_size']} --layers {m['num_layers']} --heads {m['num_heads']} "
      f"--kv-heads {m.get('num_kv_heads', m['num_heads'])} --intermediate {m['intermediate_size']} "
      f"--vocab {m['vocab_size']} --seq {d['seq_len']} --batch {c['train_micro_batch_size_per_gpu']} "
      f"--threads {t['threads']} --steps {steps} --warmup {warm}")
PY
}

torch_run() {  # torch_run OUT.json [env assignments...] -- [flags...]
  local out=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  if ! env "${envs[@]}" $PY bench/e2e_torch.py "$@" >"$out" 2>"$out.err"; then
    echo "e2e: bench/e2e_torch.py $* failed (env: ${envs[*]:-default}):" >&2
    cat "$out" "$out.err" >&2
    exit 1
  fi
}

for s in "${shapes[@]}"; do
  cfg=bench/e2e_$s.json
  line=$(shape_args "$cfg")
  read -r -a args <<<"$line"
  steps=$(sed -E 's/.*--steps ([0-9]+).*/\1/' <<<"${args[*]}")
  echo "## $s: ${args[*]}"
  if ! $BIN train "$cfg" --set train.steps="$steps" --metrics "$TMP/$s.jsonl" >"$TMP/$s.log" 2>&1; then
    echo "e2e: longtrain failed on $cfg:" >&2; cat "$TMP/$s.log" >&2; exit 1
  fi
  grep '^longtrain:' "$TMP/$s.log" || true
  # The core longtrain chose, if it says; else the tuned env leaves OPENBLAS_CORETYPE as it is.
  core=$(grep -oiE 'blas .*core[= ]([A-Za-z0-9]+)' "$TMP/$s.log" | head -1 | sed -E 's/.*[Cc][Oo][Rr][Ee][= ]//' || true)
  tuned=(LD_PRELOAD="$TCMALLOC")
  [[ -n $core ]] && tuned+=(OPENBLAS_CORETYPE="$core")
  echo "$core" >"$TMP/$s.core"
  if [[ -n $core ]]; then why="core from longtrain's start-up line"
  else why="longtrain printed no BLAS core; OPENBLAS_CORETYPE left as is: ${OPENBLAS_CORETYPE:-<unset>}"; fi
  echo "tuned env: ${tuned[*]} ($why)"
  torch_run "$TMP/$s.default.json" -- "${args[@]}"
  torch_run "$TMP/$s.default_ckpt.json" -- "${args[@]}" --checkpoint
  torch_run "$TMP/$s.tuned.json" "${tuned[@]}" -- "${args[@]}"
  torch_run "$TMP/$s.tuned_ckpt.json" "${tuned[@]}" -- "${args[@]}" --checkpoint
  echo "$s done at $((SECONDS - T0)) s"
done

# GEMM peak: longtrain's gemm_peak_flops metric when every shape has it; else measured here in the tuned env.
first=${shapes[0]}
if ! $PY - "$TMP" "${shapes[@]}" <<'PY'
import json, sys
d, shapes = sys.argv[1], sys.argv[2:]
sys.exit(0 if all("gemm_peak_flops" in json.loads(open(f"{d}/{s}.jsonl").readlines()[-1]) for s in shapes) else 1)
PY
then
  core=$(cat "$TMP/$first.core")
  threads=$(sed -E 's/.*--threads ([0-9]+).*/\1/' <<<"$(shape_args "bench/e2e_$first.json")")
  torch_run "$TMP/peak.json" LD_PRELOAD="$TCMALLOC" ${core:+OPENBLAS_CORETYPE="$core"} -- --gemm-peak --threads "$threads"
fi

$PY - "$TMP" "${shapes[@]}" <<'PY'
import json, math, os, re, statistics, sys
d, shapes = sys.argv[1], sys.argv[2:]
G = 1e9
measured = json.load(open(f"{d}/peak.json"))["gemm_peak_flops"] if os.path.exists(f"{d}/peak.json") else None
pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"
rows, notes, peaks_used = [], [], {}
for s in shapes:
    c = json.loads("\n".join(l for l in open(f"bench/e2e_{s}.json") if not re.match(r"\s*//", l)))
    m = [json.loads(l) for l in open(f"{d}/{s}.jsonl")]
    t = {v: json.load(open(f"{d}/{s}.{v}.json")) for v in ("default", "default_ckpt", "tuned", "tuned_ckpt")}
    warm = t["default"]["warmup"]
    kept = [r for r in m if r["step"] > warm]
    lt_step = statistics.median(r["step_time_s"] for r in kept)
    lt_tps = statistics.median(r["tokens_per_s"] for r in kept)
    fpt = t["default"]["flops_per_token"]
    if "model_flops_per_token" in m[-1] and abs(m[-1]["model_flops_per_token"] - fpt) > 1e-6 * fpt:
        notes.append(f"{s}: longtrain's model_flops_per_token {m[-1]['model_flops_per_token']:.6g} != this script's {fpt:.6g}")
    peak = m[-1].get("gemm_peak_flops", measured)
    src = ("longtrain's gemm_peak_flops metric" if "gemm_peak_flops" in m[-1] else
           "measured here: torch sgemm 2048^3 fp32, tuned env, best of 5")
    peaks_used.setdefault((peak, src), []).append(s)
    mfu = lambda tps: tps * fpt / peak
    lt_mfu_metric = statistics.median(r["mfu"] for r in kept) if "mfu" in m[-1] else None
    # longtrain's start-up line rounds the parameter count to 0.01M.
    pm = re.search(r"model ([0-9.]+)M params", open(f"{d}/{s}.log").read())
    n = t["default"]["params"]
    lt_n = f"{pm.group(1)}M" if pm else "?"
    ok = pm is not None and abs(float(pm.group(1)) * 1e6 - n) <= 0.005e6 + 1
    print(f"{s}: params torch {n} = ModelConfig::numParams {n} (longtrain prints {lt_n}{'' if ok else ', MISMATCH'}); "
          f"FLOPs/token {fpt:.4g}; median over steps {warm + 1}..{len(m)}")
    print(f"  longtrain          step {lt_step:.4f} s  {lt_tps:9.0f} tok/s  MFU {pct(mfu(lt_tps))} "
          f"(metrics mfu: {pct(lt_mfu_metric)})  loss {m[0]['loss']:.4f} -> {m[-1]['loss']:.4f}")
    for v, r in t.items():
        print(f"  torch {v:12s} step {r['median_step_s']:.4f} s  {r['tokens_per_s']:9.0f} tok/s  MFU {pct(mfu(r['tokens_per_s']))} "
              f"loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}  threads {r['threads']}")
    if not ok:
        notes.append(f"{s}: longtrain reports {lt_n} params, torch model has {n}")
    cell = lambda v: f"{t[v]['tokens_per_s']:.0f} ({pct(mfu(t[v]['tokens_per_s']))})"
    tuned_best = max(t["tuned"]["tokens_per_s"], t["tuned_ckpt"]["tokens_per_s"])
    default_best = max(t["default"]["tokens_per_s"], t["default_ckpt"]["tokens_per_s"])
    rows.append(f"| {s} | {lt_tps:.0f} | {pct(mfu(lt_tps))} (metrics: {pct(lt_mfu_metric)}) | {cell('default')} | "
                f"{cell('default_ckpt')} | {cell('tuned')} | {cell('tuned_ckpt')} | {lt_tps / tuned_best:.2f}x | "
                f"{lt_tps / default_best:.2f}x |")
print()
print("| shape | longtrain tok/s | MFU | torch default | torch default + ckpt | torch tuned | torch tuned + ckpt "
      "| longtrain / tuned best | longtrain / default best |")
print("|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
print()
print("torch cells: tokens/s (MFU). MFU = tokens/s x model FLOPs per token / GEMM peak; FLOPs per token = "
      "6 x (non-embedding + LM-head params) + 6 x layers x seq x hidden.")
for (peak, src), ss in peaks_used.items():
    print(f"GEMM peak used for {', '.join(ss)}: {peak / G:.1f} GFLOP/s ({src})")
for n in notes:
    print("NOTE:", n)
PY
echo "total $((SECONDS - T0)) s"
