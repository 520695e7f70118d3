#!/usr/bin/env bash
# GPU regression gate (self-hosted GPU runner): the GPU-marked tests, then the baseline's runs again and compared:
#
#   python -m cbbench.perf.bench.gpu_runs split results/baselines/<gpu>.csv PARTS   # one file per --like group
#   python -m cbbench.perf.bench.gpu_runs perf RUNS @part0 --like PARTS/..part0.csv --repeats 3 @part1 ...
#   python -m cbbench.perf.bench.gpu_runs merge "$OUT/<gpu>.csv" RUNS/part*.csv
#   cbbench compare results/baselines/<gpu>.csv "$OUT/<gpu>.csv"          # tolerances: <gpu>.tolerances.toml
#
# <gpu> comes from nvidia-smi ("NVIDIA H200" -> h200). The baseline holds several workloads and models (ci/gpu_env.sh's
# GPU_QWEN_RUNS and GPU_LLAMA_RUNS); `perf --like` reruns one (workload, model) group, so the gate splits it, reruns
# every part in one process (a model's weights drawn once; each engine gives the card back before the next), merges
# the new rows and compares the whole. The baseline is made on that GPU by ci/gpu_check.sh (its record step) or by
# UPDATE_BASELINE=1 here. Its tolerances live beside it (results/baselines/h200.tolerances.toml says what is gated
# how tightly, and why). A missing baseline is one line on stderr and exit 2, before anything runs.
#
# Usage:  bash ci/gpu_gate.sh [--dry-run]        # setup as ci/gpu_check.sh (offline-capable), GPU tests, gate
#         UPDATE_BASELINE=1 bash ci/gpu_gate.sh  # record results/baselines/<gpu>.csv (new, or the same configs again)
# Env:    OUT (default results/gpu-ci), VENV (default .venv-gpu), PYTHON, WHEELHOUSE, REPEATS (default 3),
#         SKIP_TESTS=1, SUMMARY (a file for compare's markdown; default $GITHUB_STEP_SUMMARY), GPU_SLUG (the <gpu>
#         name, instead of asking nvidia-smi), BASELINE_DIR (default results/baselines), SKIP_SETUP=1 (use $PYTHON
#         as it is). --dry-run prints the plan and runs nothing. perf/tests/test_gpu_gate.py runs this whole flow on
#         a CPU, with a baseline made on the simulated H200 (and a planted slowdown that must fail it).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
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
LIKE=1  # rerun the baseline's configurations (else: record a first baseline from ci/gpu_env.sh's runs)
if [[ ! -f "$BASELINE" ]]; then
  if [[ $UPDATE == 1 ]]; then
    LIKE=0
  else
    MSG="gpu_gate: no baseline $BASELINE for $GPU; record one on this GPU with UPDATE_BASELINE=1 bash ci/gpu_gate.sh (or bash ci/gpu_check.sh) and commit it"
    [[ $DRY_RUN == 1 ]] || { echo "$MSG" >&2; exit 2; }
    echo "dry run: ${MSG#gpu_gate: } (the plan below is the gate's once it exists)"
    LIKE=-1
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
  # one process, not xdist workers: every engine on the card in turn
  run "$PY" -m pytest -m gpu -p no:xdist -p no:cacheprovider -o addopts= -q conformance/ perf/tests/ refengine/tests/
fi

[[ $DRY_RUN == 1 ]] || rm -rf "$OUT"
RUNS=$OUT/runs
GROUPS_ARGS=()
if [[ $LIKE == 1 ]]; then
  PARTS_DIR=$OUT/parts
  if [[ $DRY_RUN == 1 ]]; then  # (a dry run leaves nothing behind)
    PARTS_DIR=$(mktemp -d)
    trap 'rm -rf "$PARTS_DIR"' EXIT
  fi
  mapfile -t PARTS < <("$PY" -m cbbench.perf.bench.gpu_runs split "$BASELINE" "$PARTS_DIR")
  [[ ${#PARTS[@]} -gt 0 ]] || { echo "gpu_gate: $BASELINE could not be split into its runs" >&2; exit 2; }
  for i in "${!PARTS[@]}"; do GROUPS_ARGS+=("@part$i" --like "${PARTS[$i]}" --repeats "$REPEATS"); done
  echo "== perf --like $BASELINE: ${#PARTS[@]} part(s), $REPEATS repeats"
else  # UPDATE_BASELINE=1 with no baseline yet (or the plan of a dry run without one): the baseline's runs
  for a in "${GPU_QWEN_RUNS[@]}" "${GPU_LLAMA_RUNS[@]}"; do
    [[ $a == @* && ${#GROUPS_ARGS[@]} -gt 0 ]] && GROUPS_ARGS+=(--repeats "$REPEATS" --label "$GPU-baseline")
    GROUPS_ARGS+=("$a")
  done
  GROUPS_ARGS+=(--repeats "$REPEATS" --label "$GPU-baseline")
  echo "== perf: the runs of ci/gpu_env.sh, $REPEATS repeats"
fi
run "$PY" -m cbbench.perf.bench.gpu_runs perf "$RUNS" "${GROUPS_ARGS[@]}"
NAMES=()
for a in "${GROUPS_ARGS[@]}"; do [[ $a == @* ]] && NAMES+=("$RUNS/${a#@}.csv"); done
run "$PY" -m cbbench.perf.bench.gpu_runs merge "$NEW" "${NAMES[@]}"

if [[ $UPDATE == 1 ]]; then
  run cp "$NEW" "$BASELINE"
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
