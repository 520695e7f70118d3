#!/usr/bin/env bash
# Every GPU check and benchmark as one prepared command for a fresh GPU box (only this repo, maybe no network):
# its own setup, under 8 minutes in all, and the perf baseline results/baselines/<gpu>.csv (h200.csv on an H200).
#
#   bash ci/gpu_check.sh [--dry-run] [OUTDIR]        (OUTDIR default results/gpu-check)
#
# Steps, each under its own time limit (so one that hangs cannot eat the others' time; all run even if one fails),
# and never past the whole script's deadline (TOTAL_S, default 470 s):
#   setup         python3 with CUDA torch + a --system-site-packages venv (ci/gpu_env.sh)   (~60 s, counted)
#   gpu-tests     pytest -m gpu conformance/ perf/tests/ refengine/tests/  -> OUTDIR/gpu-tests.xml     (110 s)
#   kernels       cbbench kernels --quick                  -> OUTDIR/kernels.csv                 ( 60 s)
#   perf          cbbench perf, GPU_PERF_ARGS of ci/gpu_env.sh (sharegpt, qwen2.5-0.5b, refengine continuous /
#                 static at up to 256 running, HF static)   -> OUTDIR/*.csv, *.json               (160 s)
#   baseline      the perf CSV, checked by cbbench.perf.results.files.read_csv -> results/baselines/<gpu>.csv   ( 10 s)
#   calibration   the perf step's workload again on sim:<gpu> (the cost model), and the error per configuration
#                 and metric, simulated vs real (perf/bench/sim_calibration.py) -> OUTDIR/calibration.csv  ( 20 s)
#   bench-step    cbbench bench-step --stub-model on CUDA at 64 / 256 running (host time per step, the host-time
#                 1.5 ms target)                                -> OUTDIR/bench-step.log            ( 30 s)
# --dry-run: print the plan (python found, steps, limits, commands) and run nothing; works on a CPU machine.
# Env: PYTHON (a python3 with CUDA torch), WHEELHOUSE (wheels of missing packages), VENV (default .venv-gpu-check),
#      MODEL, NUM_PROMPTS, TOTAL_S. Exit: 0 when every step passed, 1 when one failed, 2 when setup failed.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
ARGS=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $a" >&2; exit 2 ;;
    *) ARGS+=("$a") ;;
  esac
done
OUT=${ARGS[0]:-results/gpu-check}
VENV=${VENV:-.venv-gpu-check}
TOTAL_S=${TOTAL_S:-470}
# shellcheck source=ci/gpu_env.sh
source ci/gpu_env.sh
DEADLINE=$((SECONDS + TOTAL_S))
status=0

echo "== setup"  # (not under `timeout`: it sets this shell's variables; offline, so nothing can hang on the network)
if ! setup_gpu_env "$VENV" "$DRY_RUN"; then
  exit 2
fi
GPU=$(gpu_slug)
if [[ -z "$GPU" ]]; then
  [[ $DRY_RUN == 1 ]] || { echo "gpu_check: no GPU found by nvidia-smi" >&2; exit 2; }
  GPU=h200  # dry run on a machine without a GPU: show the plan for the H200 this script is sized for
fi
BASELINE=results/baselines/$GPU.csv
echo "python: $PY (torch ${TORCH_VERSION:-?})"
[[ $DRY_RUN == 1 ]] || { mkdir -p "$OUT"; : > "$OUT/summary.txt"; }
[[ $DRY_RUN == 1 ]] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1

step() {  # step NAME SECONDS CMD...: run under min(SECONDS, time left before the deadline)
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - SECONDS))
  (( limit > left )) && limit=$left
  if [[ $DRY_RUN == 1 ]]; then
    echo "step $name limit=${limit}s: $*"
    return 0
  fi
  if (( limit <= 5 )); then
    echo "$name rc=skipped seconds=0 (deadline reached)" | tee -a "$OUT/summary.txt"; status=1; return 1
  fi
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/summary.txt"
  [[ $rc == 0 ]] || status=1
  return "$rc"
}

step gpu-tests 110 "$PY" -m pytest -m gpu conformance/ perf/tests/ refengine/tests/ -q --junitxml "$OUT/gpu-tests.xml"
step kernels 60 "${CB[@]}" kernels --out "$OUT/kernels.csv" --quick
PERF_DIR="$OUT/perf"
[[ $DRY_RUN == 1 ]] || rm -rf "$PERF_DIR"
if step perf 160 "${CB[@]}" perf "${GPU_PERF_ARGS[@]}" --result-dir "$PERF_DIR" --quiet; then
  NEW=$(ls -t "$PERF_DIR"/*.csv 2>/dev/null | head -n 1)
  [[ $DRY_RUN == 1 ]] && NEW="$PERF_DIR/<newest>.csv"
  step baseline 10 "$PY" -c "import shutil, sys; from cbbench.perf.results.files import read_csv; df = read_csv(sys.argv[1]); \
assert len(df), 'empty perf CSV'; shutil.copyfile(sys.argv[1], sys.argv[2]); print(f'wrote {sys.argv[2]}: {len(df)} rows')" \
    "${NEW:-missing.csv}" "$BASELINE"
  SIM_ARGS=("${GPU_PERF_ARGS[@]/#cuda/sim:$GPU}")  # the same workload on the simulated twin of this GPU
  step calibration 20 "$PY" -m cbbench.perf.bench.sim_calibration "${NEW:-missing.csv}" "$OUT" "${SIM_ARGS[@]}"
fi

step bench-step 30 "${CB[@]}" bench-step --stub-model --device cuda --running 64,256 --iters 100

[[ $DRY_RUN == 1 ]] && { echo "dry run: nothing was run"; exit 0; }
cat "$OUT/summary.txt"
exit $status
