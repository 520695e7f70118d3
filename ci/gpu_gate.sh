#!/usr/bin/env bash
# GPU regression gate (self-hosted GPU runner): the GPU-marked tests, then `cbbench gate`: this tree against a base
# revision, both measured on the card in one job, interleaved, each run a fresh process of its own tree's code (no
# stored baseline needed: any card, any driver, works the first time). Then, only when results/baselines/<gpu>.csv
# exists, the stored-baseline comparison as a trend check (drift across days; reported, never the verdict):
#
#   cbbench gate --base "$GATE_BASE" --model qwen2.5-0.5b --device cuda ... --output "$OUT/gate.csv"   # the verdict
#   python -m benchmarks.gpu_runs split results/baselines/<gpu>.csv PARTS   # trend: one file per --like group
#   python -m benchmarks.gpu_runs perf RUNS @part0 --like PARTS/..part0.csv --repeats 3 @part1 ...
#   python -m benchmarks.gpu_runs merge "$OUT/<gpu>.csv" RUNS/part*.csv
#   cbbench compare results/baselines/<gpu>.csv "$OUT/<gpu>.csv"          # tolerances: <gpu>.tolerances.toml
#
# <gpu> comes from nvidia-smi ("NVIDIA H200" -> h200). The trend baseline holds several workloads and models
# (ci/gpu_env.sh's GPU_QWEN_RUNS and GPU_LLAMA_RUNS); `perf --like` reruns one (workload, model) group, so the check
# splits it, reruns every part in one process, merges the new rows and compares the whole, with the tolerances beside
# it (results/baselines/h200.tolerances.toml). The baseline is made on that GPU by ci/gpu_check.sh (its record step)
# or by UPDATE_BASELINE=1 here. Without one, the trend check is skipped with a notice; the gate runs all the same.
#
# Usage:  bash ci/gpu_gate.sh [--dry-run]        # setup as ci/gpu_check.sh (offline-capable), GPU tests, gate, trend
#         UPDATE_BASELINE=1 bash ci/gpu_gate.sh  # record results/baselines/<gpu>.csv (new, or the same configs again)
# Env:    GATE_BASE (the revision to gate against; default: the merge base with origin/main, or HEAD~1 when HEAD is
#         on it), GATE_ARGS (the gate's workload; default below), REPEATS (runs per arm, default 10), MAX_REPEATS
#         and ON_INCONCLUSIVE (below), OUT (default
#         results/gpu-ci), VENV (default .venv-gpu), PYTHON, WHEELHOUSE, SKIP_TESTS=1, SKIP_GATE=1 (the trend check
#         alone), TREND_REPEATS (default 3), TREND_FAILS=1 (a trend regression fails the job too), SUMMARY (a file for
#         the markdown; default $GITHUB_STEP_SUMMARY), GPU_SLUG (the <gpu> name, instead of asking nvidia-smi),
#         BASELINE_DIR (default results/baselines), SKIP_SETUP=1 (use $PYTHON as it is). --dry-run prints the plan
#         and runs nothing. perf/tests/test_gpu_gate.py runs this whole flow on a CPU, on the simulated H200.
# Exit:   the gate's: 0 no regression, 1 a regression (or, with TREND_FAILS=1, a trend regression), 2 bad input,
#         3 inconclusive after MAX_REPEATS runs per arm (default 16; ON_INCONCLUSIVE=pass makes it 0).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "gpu_gate: unknown argument $a" >&2; exit 2 ;;
  esac
done
VENV=${VENV:-.venv-gpu}
OUT=${OUT:-results/gpu-ci}
REPEATS=${REPEATS:-10}  # a GPU run repeats more closely than a shared CPU's: half the CPU gate's 20
MAX_REPEATS=${MAX_REPEATS:-16}  # what an inconclusive gate may grow to: 3 more ABBA blocks
TREND_REPEATS=${TREND_REPEATS:-3}  # compare's rule "every new repeat worse than every baseline repeat" needs a few
SUMMARY=${SUMMARY:-${GITHUB_STEP_SUMMARY:-}}
UPDATE=${UPDATE_BASELINE:-0}
# The gate's workload: the small GPU preset on ShareGPT, more requests than slots (continuous batching admits as
# others finish), each run short enough that 2 x REPEATS fresh processes take minutes.
GATE_ARGS=${GATE_ARGS:---model qwen2.5-0.5b --device cuda --workload sharegpt --num-prompts 500 --max-num-seqs 256 --warmup 4}
# shellcheck source=ci/gpu_env.sh
source ci/gpu_env.sh

GPU=${GPU_SLUG:-$(gpu_slug)}
if [[ -z "$GPU" ]]; then
  [[ $DRY_RUN == 1 ]] || { echo "gpu_gate: no GPU found by nvidia-smi (GPU_SLUG=NAME names one)" >&2; exit 2; }
  GPU=h200  # dry run on a machine without a GPU: the plan for the H200 the workload is sized for
fi
BASELINE=${BASELINE_DIR:-results/baselines}/$GPU.csv
TOLERANCES=${BASELINE%.csv}.tolerances.toml
NEW=$OUT/$GPU.csv
TREND=1  # rerun the baseline's configurations and compare (else: no baseline, or record a first one)
[[ -f "$BASELINE" ]] || TREND=0

if [[ "${SKIP_SETUP:-0}" == 1 ]]; then
  PY=${PYTHON:-python3}; CB=("$PY" -m cbbench.perf.cli)
else
  setup_gpu_env "$VENV" "$DRY_RUN" || exit 2
fi

run() {  # echo in a dry run, else run; a failing command fails the gate
  if [[ $DRY_RUN == 1 ]]; then echo "run: $*"; return 0; fi
  "$@" || { echo "gpu_gate: failed: $*" >&2; exit 1; }
}

if [[ "${SKIP_TESTS:-0}" != 1 && $UPDATE != 1 ]]; then
  echo "== GPU tests ($GPU)"
  # one process, not xdist workers: every engine on the card in turn
  run "$PY" -m pytest -m gpu -p no:xdist -p no:cacheprovider -o addopts= -q conformance/ perf/tests/ refengine/tests/
fi

[[ $DRY_RUN == 1 ]] || rm -rf "$OUT"
status=0
if [[ "${SKIP_GATE:-0}" != 1 && $UPDATE != 1 ]]; then
  if [[ -z "${GATE_BASE:-}" ]]; then
    GATE_BASE=$(git merge-base HEAD origin/main 2>/dev/null || true)
    if [[ -z "$GATE_BASE" || "$GATE_BASE" == "$(git rev-parse HEAD 2>/dev/null)" ]]; then GATE_BASE=HEAD~1; fi
  fi
  echo "== gate: $GATE_BASE -> this tree, on $GPU, $REPEATS runs per arm"
  # shellcheck disable=SC2206  # GATE_ARGS is a list of options, split on spaces as written
  # A GPU's runs repeat closely enough that an inconclusive gate means too few runs, not a noisy runner: it adds
  # ABBA blocks up to MAX_REPEATS per arm, and one still inconclusive fails the job (exit 3) unless ON_INCONCLUSIVE=pass
  GATE=("${CB[@]}" gate --base "$GATE_BASE" $GATE_ARGS --repeats "$REPEATS" --output "$OUT/gate.csv"
    --max-repeats "$MAX_REPEATS" --on-inconclusive "${ON_INCONCLUSIVE:-fail}")
  [[ -n "$SUMMARY" ]] && GATE+=(--summary "$SUMMARY")
  if [[ $DRY_RUN == 1 ]]; then
    echo "run: ${GATE[*]}"
  else
    mkdir -p "$OUT"
    "${GATE[@]}"
    status=$?
  fi
fi

RUNS=$OUT/runs
GROUPS_ARGS=()
if [[ $TREND == 1 ]]; then
  PARTS_DIR=$OUT/parts
  if [[ $DRY_RUN == 1 ]]; then  # (a dry run leaves nothing behind)
    PARTS_DIR=$(mktemp -d)
    trap 'rm -rf "$PARTS_DIR"' EXIT
  fi
  mapfile -t PARTS < <("$PY" -m benchmarks.gpu_runs split "$BASELINE" "$PARTS_DIR")
  [[ ${#PARTS[@]} -gt 0 ]] || { echo "gpu_gate: $BASELINE could not be split into its runs" >&2; exit 2; }
  for i in "${!PARTS[@]}"; do GROUPS_ARGS+=("@part$i" --like "${PARTS[$i]}" --repeats "$TREND_REPEATS"); done
  echo "== trend: perf --like $BASELINE: ${#PARTS[@]} part(s), $TREND_REPEATS repeats"
elif [[ $UPDATE == 1 ]]; then  # no baseline yet: record one from the runs of ci/gpu_env.sh
  for a in "${GPU_QWEN_RUNS[@]}" "${GPU_LLAMA_RUNS[@]}"; do
    [[ $a == @* && ${#GROUPS_ARGS[@]} -gt 0 ]] && GROUPS_ARGS+=(--repeats "$TREND_REPEATS" --label "$GPU-baseline")
    GROUPS_ARGS+=("$a")
  done
  GROUPS_ARGS+=(--repeats "$TREND_REPEATS" --label "$GPU-baseline")
  echo "== perf: the runs of ci/gpu_env.sh, $TREND_REPEATS repeats"
else
  MSG="trend check skipped: no baseline $BASELINE for $GPU (UPDATE_BASELINE=1 bash ci/gpu_gate.sh or bash ci/gpu_check.sh records one)"
  echo "== $MSG"
  [[ -n "$SUMMARY" && $DRY_RUN != 1 ]] && echo "$MSG" >> "$SUMMARY"
  exit "$status"
fi
run "$PY" -m benchmarks.gpu_runs perf "$RUNS" "${GROUPS_ARGS[@]}"
NAMES=()
for a in "${GROUPS_ARGS[@]}"; do [[ $a == @* ]] && NAMES+=("$RUNS/${a#@}.csv"); done
run "$PY" -m benchmarks.gpu_runs merge "$NEW" "${NAMES[@]}"

if [[ $UPDATE == 1 ]]; then
  run cp "$NEW" "$BASELINE"
  [[ $DRY_RUN == 1 ]] && exit 0
  [[ -f "$TOLERANCES" ]] || echo "gpu_gate: no $TOLERANCES: compare's defaults will gate (5 % throughput, 10 % latency)"
  echo "baseline written: $BASELINE (commit it)"
  exit 0
fi

echo "== trend: compare $BASELINE -> $NEW (tolerances: $([[ -f "$TOLERANCES" ]] && echo "$TOLERANCES" || echo "compare's defaults"))"
if [[ $DRY_RUN == 1 ]]; then
  echo "run: ${CB[*]} compare $BASELINE $NEW"
  exit 0
fi
if [[ -n "$SUMMARY" ]]; then
  "${CB[@]}" compare "$BASELINE" "$NEW" --format markdown >>"$SUMMARY" || true
fi
"${CB[@]}" compare "$BASELINE" "$NEW"
trend=$?
if [[ $trend != 0 ]]; then
  echo "gpu_gate: the trend check against $BASELINE found a change (exit $trend): days apart, so a drift of the runner may be why" >&2
  [[ "${TREND_FAILS:-0}" == 1 && $status == 0 ]] && status=$trend
fi
exit "$status"
