#!/usr/bin/env bash
# GPU regression gate (self-hosted GPU runner): GPU-marked tests, the perf workload of ci/gpu_env.sh
# (GPU_PERF_ARGS, the one results/baselines/<gpu>.csv is made with by ci/gpu_check.sh), and `cbbench compare`
# against that baseline, where <gpu> comes from nvidia-smi ("NVIDIA H200" -> h200).
# A dedicated GPU is far quieter than a shared CPU, so compare's default tolerances apply (throughput 5 %,
# latency 10 %) except TTFT p99, which moves with admission order.
#
# Usage:  bash ci/gpu_gate.sh [--dry-run]        # setup as ci/gpu_check.sh (offline-capable), then gate
#         UPDATE_BASELINE=1 bash ci/gpu_gate.sh   # write results/baselines/<gpu>.csv from this run
# Env:    OUT (default results/gpu-ci), VENV (default .venv-gpu), PYTHON, WHEELHOUSE, MODEL, NUM_PROMPTS,
#         REPEATS (default 3). --dry-run prints the plan and runs nothing (works on a CPU machine).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu_gate: unknown argument $a" >&2; exit 2 ;;
  esac
done
VENV=${VENV:-.venv-gpu}
OUT=${OUT:-results/gpu-ci}
REPEATS=${REPEATS:-3}
# shellcheck source=ci/gpu_env.sh
source ci/gpu_env.sh

GPU=$(gpu_slug)
if [[ -z "$GPU" ]]; then
  [[ $DRY_RUN == 1 ]] || { echo "gpu_gate: no GPU found by nvidia-smi" >&2; exit 2; }
  GPU=h200
fi
BASELINE=results/baselines/$GPU.csv
setup_gpu_env "$VENV" "$DRY_RUN" || exit 2

run() {  # echo in a dry run, else run; a failing command fails the gate
  if [[ $DRY_RUN == 1 ]]; then echo "run: $*"; return 0; fi
  "$@" || { echo "gpu_gate: failed: $*" >&2; exit 1; }
}

echo "== GPU tests ($GPU)"
run "$PY" -m pytest -m gpu conformance/ perf/tests/ -q

echo "== perf (${GPU_PERF_ARGS[*]}, $REPEATS repeats)"
[[ $DRY_RUN == 1 ]] || rm -rf "$OUT"
run "${CB[@]}" perf "${GPU_PERF_ARGS[@]}" --repeats "$REPEATS" --result-dir "$OUT" --quiet
if [[ $DRY_RUN == 1 ]]; then
  echo "run: ${CB[*]} compare $BASELINE $OUT/<newest>.csv --tolerance p99_ttft_ms=25% --tolerance request_goodput=off"
  exit 0
fi
NEW=$(ls -t "$OUT"/*.csv | head -n 1)

if [[ "${UPDATE_BASELINE:-0}" == 1 || ! -f "$BASELINE" ]]; then
  cp "$NEW" "$BASELINE"
  echo "baseline written: $BASELINE (commit it; there was none for $GPU)" >&2
  [[ "${UPDATE_BASELINE:-0}" == 1 ]] && exit 0
  exit 1   # a missing baseline must not pass silently
fi

echo "== compare $BASELINE -> $NEW"
"${CB[@]}" compare "$BASELINE" "$NEW" --tolerance 'p99_ttft_ms=25%' --tolerance 'request_goodput=off'
