#!/usr/bin/env bash
# CPU regression gate: conformance suite + a small, fixed-seed perf run compared against results/baselines/cpu.csv.
#
# What it can catch: a broken pipeline (any failing step fails the gate), a change in what the scheduler does
# (preemptions, peak KV blocks, slot utilisation and static slot waste are deterministic for a fixed workload and
# are gated at 1 %), and LARGE speed regressions only: shared CPU runners are noisy (2x swings seen on a 2-core box),
# so throughputs may fall to 40 % of the baseline and latencies rise to 3x before the gate fails. Real performance
# gating belongs to ci/gpu_gate.sh on a dedicated GPU runner.
#
# Usage:  bash ci/cpu_gate.sh                 # creates .venv-ci with ci/setup.sh, then gates
#         VENV=/path/to/venv SKIP_SETUP=1 bash ci/cpu_gate.sh   # reuse an existing venv
#         UPDATE_BASELINE=1 bash ci/cpu_gate.sh                 # rewrite results/baselines/cpu.csv from this run
# Env:    OUT (default results/ci), PYTEST_ARGS (extra pytest arguments, e.g. "-x"),
#         SKIP_TESTS=1 (perf + compare only, e.g. when refreshing the baseline)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv-ci}
OUT=${OUT:-results/ci}
BASELINE=results/baselines/cpu.csv
# One place for the gate's workload: the baseline must have been made with exactly these arguments.
PERF_ARGS=(--workload fixed --workload-param input_len=64,output_len=16 --num-prompts 8 --seed 0
           --batching continuous,static --max-num-seqs 4 --peers none --repeats 3 --warmup 2 --cpu-threads 1)
TOLERANCES=(--tolerance '*_throughput=60%' --tolerance 'request_goodput=off'
            --tolerance 'mean_*_ms=200%' --tolerance 'median_*_ms=200%' --tolerance 'p99_*_ms=200%'
            --tolerance 'num_preemptions=1%' --tolerance 'peak_kv_blocks=1%'
            --tolerance 'mean_slot_utilisation=1%' --tolerance 'slot_waste=1%')

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  bash ci/setup.sh "$VENV"
fi
BIN="$VENV/bin"

if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  echo "== conformance"
  "$BIN/python" -m pytest conformance/ perf/tests/ -q -m "not gpu and not slow" ${PYTEST_ARGS:-}
fi

echo "== perf (small CPU run)"
rm -rf "$OUT"
"$BIN/cbbench" perf "${PERF_ARGS[@]}" --result-dir "$OUT" --quiet
NEW=$(ls -t "$OUT"/*.csv | head -n 1)

if [[ "${UPDATE_BASELINE:-0}" == 1 ]]; then
  cp "$NEW" "$BASELINE"
  echo "baseline updated: $BASELINE"
  exit 0
fi

echo "== compare $BASELINE -> $NEW"
"$BIN/cbbench" compare "$BASELINE" "$NEW" "${TOLERANCES[@]}"
