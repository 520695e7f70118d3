#!/usr/bin/env bash
# CPU regression gate: the test suites, then the baseline's own configurations rerun and compared with it.
#
#   cbbench perf --like results/baselines/cpu.csv --output "$OUT/cpu.csv"   # exactly the baseline's runs
#   cbbench compare results/baselines/cpu.csv "$OUT/cpu.csv"                # its tolerances: cpu.tolerances.toml
#   then the same for results/baselines/sim-h200.csv (a simulated H200: deterministic, tightly gated)
#
# The baseline records its full configuration (workload, knobs, repeats) and the command it was made with; its
# tolerances live beside it in results/baselines/cpu.tolerances.toml (see that file for what is gated how tightly).
# Shared CPU runners are noisy, so this gate checks the pipeline, what the scheduler does (deterministic), and
# large speed regressions only; real performance gating belongs to ci/gpu_gate.sh on a dedicated GPU runner.
#
# Usage:  bash ci/cpu_gate.sh                 # creates .venv-ci with ci/setup.sh, then gates
#         VENV=/path/to/venv SKIP_SETUP=1 bash ci/cpu_gate.sh   # reuse an existing venv
#         UPDATE_BASELINE=1 bash ci/cpu_gate.sh                 # rewrite results/baselines/cpu.csv from this run
# Env:    OUT (default results/ci), PYTEST_ARGS (extra pytest arguments, e.g. "-x"),
#         SKIP_TESTS=1 (perf + compare only, e.g. when refreshing the baseline),
#         SUMMARY (a file to append compare's markdown to; default $GITHUB_STEP_SUMMARY when set)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv-ci}
OUT=${OUT:-results/ci}
BASELINE=results/baselines/cpu.csv
SUMMARY=${SUMMARY:-${GITHUB_STEP_SUMMARY:-}}

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  bash ci/setup.sh "$VENV"
fi
BIN="$VENV/bin"

if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  echo "== tests"
  "$BIN/python" -m pytest conformance/ perf/tests/ refengine/tests/ -q -m "not gpu and not slow" ${PYTEST_ARGS:-}
fi

echo "== perf --like $BASELINE"
rm -rf "$OUT"
"$BIN/cbbench" perf --like "$BASELINE" --output "$OUT/cpu.csv" --quiet

if [[ "${UPDATE_BASELINE:-0}" == 1 ]]; then
  cp "$OUT/cpu.csv" "$BASELINE"
  cp "$OUT/cpu.json" "${BASELINE%.csv}.json"
  echo "baseline updated: $BASELINE"
  exit 0
fi

echo "== compare $BASELINE -> $OUT/cpu.csv"
if [[ -n "$SUMMARY" ]]; then
  "$BIN/cbbench" compare "$BASELINE" "$OUT/cpu.csv" --format markdown >>"$SUMMARY" || true
fi
"$BIN/cbbench" compare "$BASELINE" "$OUT/cpu.csv"

# The simulated gate: the same baseline-rerun-compare on a simulated H200 (no GPU needed). A simulated run is
# deterministic, so its tolerances (sim-h200.tolerances.toml) are tight enough to catch a scheduler regression.
SIM_BASELINE=results/baselines/sim-h200.csv
echo "== perf --like $SIM_BASELINE"
"$BIN/cbbench" perf --like "$SIM_BASELINE" --output "$OUT/sim-h200.csv" --quiet
echo "== compare $SIM_BASELINE -> $OUT/sim-h200.csv"
if [[ -n "$SUMMARY" ]]; then
  "$BIN/cbbench" compare "$SIM_BASELINE" "$OUT/sim-h200.csv" --format markdown >>"$SUMMARY" || true
fi
"$BIN/cbbench" compare "$SIM_BASELINE" "$OUT/sim-h200.csv"
