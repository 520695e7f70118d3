#!/usr/bin/env bash
# GPU regression gate (self-hosted GPU runner): GPU-marked conformance tests, the perf suite at GPU size, and
# `cbbench compare` against results/baselines/<gpu>.csv, where <gpu> comes from nvidia-smi ("NVIDIA H200" -> h200).
# A dedicated GPU is far quieter than a shared CPU, so compare's default tolerances apply (throughput 5 %,
# latency 10 %) except TTFT p99, which moves with admission order.
#
# Usage:  bash ci/gpu_gate.sh                 # creates .venv-gpu with ci/setup.sh, then gates
#         VENV=/path SKIP_SETUP=1 bash ci/gpu_gate.sh
#         UPDATE_BASELINE=1 bash ci/gpu_gate.sh   # write results/baselines/<gpu>.csv from this run
# Env:    OUT (default results/gpu-ci), MODEL (default qwen2.5-0.5b), NUM_PROMPTS (default 500)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv-gpu}
OUT=${OUT:-results/gpu-ci}
MODEL=${MODEL:-qwen2.5-0.5b}
NUM_PROMPTS=${NUM_PROMPTS:-500}

gpu_slug() {  # "NVIDIA H200" -> h200, "NVIDIA A100-SXM4-80GB" -> a100, "NVIDIA GeForce RTX 4090" -> 4090
  nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr '[:upper:]' '[:lower:]' \
    | sed -e 's/nvidia//; s/geforce//; s/rtx//; s/tesla//' | awk '{print $1}' | cut -d- -f1
}
GPU=$(gpu_slug)
[[ -n "$GPU" ]] || { echo "gpu_gate: no GPU found by nvidia-smi" >&2; exit 2; }
BASELINE=results/baselines/$GPU.csv

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  bash ci/setup.sh "$VENV"
fi
BIN="$VENV/bin"

echo "== GPU conformance tests ($GPU)"
"$BIN/python" -m pytest -m gpu conformance/ -q

echo "== perf suite at GPU size ($MODEL, sharegpt x $NUM_PROMPTS)"
rm -rf "$OUT"
# `none` (one request at a time) is left out: at 500 prompts it alone would take most of an hour.
"$BIN/cbbench" perf --device cuda --model "$MODEL" --workload sharegpt --num-prompts "$NUM_PROMPTS" --seed 0 \
  --batching continuous,sequence,static --peers hf-static,hf-cb --repeats 3 --result-dir "$OUT" --quiet
NEW=$(ls -t "$OUT"/*.csv | head -n 1)

if [[ "${UPDATE_BASELINE:-0}" == 1 || ! -f "$BASELINE" ]]; then
  cp "$NEW" "$BASELINE"
  echo "baseline written: $BASELINE (commit it; there was none for $GPU)" >&2
  [[ "${UPDATE_BASELINE:-0}" == 1 ]] && exit 0
  exit 1   # a missing baseline must not pass silently
fi

echo "== compare $BASELINE -> $NEW"
"$BIN/cbbench" compare "$BASELINE" "$NEW" --tolerance 'p99_ttft_ms=25%' --tolerance 'request_goodput=off'
