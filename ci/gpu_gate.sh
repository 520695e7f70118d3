#!/usr/bin/env bash
# GPU regression gate (self-hosted GPU runner): the GPU-marked tests, then the same two commands as ci/cpu_gate.sh
#
#   cbbench perf --like results/baselines/<gpu>.csv --output "$OUT/<gpu>.csv"   # exactly the baseline's runs
#   cbbench compare results/baselines/<gpu>.csv "$OUT/<gpu>.csv"                # tolerances: <gpu>.tolerances.toml
#
# <gpu> comes from nvidia-smi ("NVIDIA H200" -> h200). The baseline is made on that GPU, by ci/gpu_check.sh or by
# UPDATE_BASELINE=1 here, from the perf arguments of ci/gpu_env.sh (GPU_PERF_ARGS); --like reads its workload,
# engines, modes and knobs back from its rows. Its tolerances live beside it (results/baselines/h200.tolerances.toml
# says what is gated how tightly, and why). A missing baseline is one line on stderr and exit 2, before anything runs.
#
# Usage:  bash ci/gpu_gate.sh [--dry-run]        # setup as ci/gpu_check.sh (offline-capable), GPU tests, gate
#         UPDATE_BASELINE=1 bash ci/gpu_gate.sh  # record results/baselines/<gpu>.csv (new, or the same configs again)
# Env:    OUT (default results/gpu-ci), VENV (default .venv-gpu), PYTHON, WHEELHOUSE, MODEL and NUM_PROMPTS (a new
#         baseline's workload), REPEATS (default 3), SKIP_TESTS=1, SUMMARY (a file for compare's markdown; default
#         $GITHUB_STEP_SUMMARY), GPU_SLUG (the <gpu> name, instead of asking nvidia-smi), BASELINE_DIR (default
#         results/baselines), SKIP_SETUP=1 (use $PYTHON as it is). --dry-run prints the plan and runs nothing.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_gate: unknown argument $a" >&2; exit 2 ;;
  esac
done
VENV=${VENV:-.venv-gpu}
OUT=${OUT:-results/gpu-ci}
REPEATS=${REPEATS:-3}  # the rule "every new repeat worse than every baseline repeat" needs a few to tell noise
SUMMARY=${SUMMARY:-${GITHUB_STEP_SUMMARY:-}}
UPDATE=${UPDATE_BASELINE:-0}
# shellcheck source=ci/gpu_env.sh
source ci/gpu_env.sh

GPU=${GPU_SLUG:-$(gpu_slug)}
if [[ -z "$GPU" ]]; then
  [[ $DRY_RUN == 1 ]] || { echo "gpu_gate: no GPU found by nvidia-smi (GPU_SLUG=NAME names one)" >&2; exit 2; }
  GPU=h200  # dry run on a machine without a GPU: the plan for the H200 the baseline is sized for
fi
BASELINE=${BASELINE_DIR:-results/baselines}/$GPU.csv
TOLERANCES=${BASELINE%.csv}.tolerances.toml
NEW=$OUT/$GPU.csv
LIKE=1  # rerun the baseline's configurations (else: record a first baseline from GPU_PERF_ARGS)
if [[ ! -f "$BASELINE" ]]; then
  if [[ $UPDATE == 1 ]]; then
    LIKE=0
  else
    MSG="gpu_gate: no baseline $BASELINE for $GPU; record one on this GPU with UPDATE_BASELINE=1 bash ci/gpu_gate.sh (or bash ci/gpu_check.sh) and commit it"
    [[ $DRY_RUN == 1 ]] || { echo "$MSG" >&2; exit 2; }
    echo "dry run: ${MSG#gpu_gate: } (the plan below is the gate's once it exists)"
  fi
fi

if [[ "${SKIP_SETUP:-0}" == 1 ]]; then
  PY=${PYTHON:-python3}; CB=("$PY" -m cbbench.perf.cli)
else
  setup_gpu_env "$VENV" "$DRY_RUN" || exit 2
fi

run() {  # echo in a dry run, else run; a failing command fails the gate
  if [[ $DRY_RUN == 1 ]]; then echo "run: $*"; return 0; fi
  "$@" || { echo "gpu_gate: failed: $*" >&2; exit 1; }
}

if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  echo "== GPU tests ($GPU)"
  run "$PY" -m pytest -m gpu conformance/ perf/tests/ refengine/tests/ -q
fi

[[ $DRY_RUN == 1 ]] || rm -rf "$OUT"
if [[ $LIKE == 1 ]]; then
  echo "== perf --like $BASELINE ($REPEATS repeats)"
  run "${CB[@]}" perf --like "$BASELINE" --repeats "$REPEATS" --output "$NEW" --quiet
else  # UPDATE_BASELINE=1 with no baseline yet: the workload every <gpu>.csv is made with
  echo "== perf (${GPU_PERF_ARGS[*]}, $REPEATS repeats)"
  run "${CB[@]}" perf "${GPU_PERF_ARGS[@]}" --repeats "$REPEATS" --label "$GPU-baseline" --output "$NEW" --quiet
fi

if [[ $UPDATE == 1 ]]; then
  run cp "$NEW" "$BASELINE"
  run cp "${NEW%.csv}.json" "${BASELINE%.csv}.json"
  [[ $DRY_RUN == 1 ]] && exit 0
  [[ -f "$TOLERANCES" ]] || echo "gpu_gate: no $TOLERANCES: compare's defaults will gate (5 % throughput, 10 % latency)"
  echo "baseline written: $BASELINE (commit it)"
  exit 0
fi

echo "== compare $BASELINE -> $NEW (tolerances: $([[ -f "$TOLERANCES" ]] && echo "$TOLERANCES" || echo "compare's defaults"))"
if [[ $DRY_RUN == 1 ]]; then
  echo "run: ${CB[*]} compare $BASELINE $NEW"
  exit 0
fi
if [[ -n "$SUMMARY" ]]; then
  "${CB[@]}" compare "$BASELINE" "$NEW" --format markdown >>"$SUMMARY" || true
fi
"${CB[@]}" compare "$BASELINE" "$NEW"
