#!/usr/bin/env bash
# Every GPU check and benchmark as one prepared command, under 8 minutes on one H200; writes CSVs and logs to OUTDIR.
#
#   bash ci/gpu_check.sh OUTDIR
#
# Steps (each under its own time limit, so one that hangs cannot eat the others' time; all run even if one fails):
#   1. GPU-marked conformance tests              -> OUTDIR/gpu-tests.xml, gpu-tests.log          (150 s)
#   2. attention kernel bench (quick sweep)      -> OUTDIR/kernels.csv                           ( 90 s)
#   3. perf, sharegpt at qwen2.5-0.5b: refengine continuous/static vs hf-static and hf-cb
#                                                -> OUTDIR/sharegpt-*.csv/json                   (150 s)
#   4. perf, fixed 1024 in / 256 out, same engines -> OUTDIR/fixed-*.csv/json                    ( 90 s)
# Uses $PYTHON (default: python) with cbbench importable; installs it editable, offline, if it is not.
# Exit code: 0 when every step passed, else 1 (OUTDIR/summary.txt lists each step's exit code and seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
PY=${PYTHON:-python}
MODEL=${MODEL:-qwen2.5-0.5b}

if ! "$PY" -c "import cbbench.perf, refengine" 2>/dev/null; then
  "$PY" -m pip install -q -e . --no-deps --no-build-isolation || { echo "cannot install cbbench" >&2; exit 2; }
fi
CB=("$PY" -m cbbench.perf.cli)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1 || true

status=0
: > "$OUT/summary.txt"
step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/summary.txt"
  [[ $rc == 0 ]] || status=1
}

step gpu-tests 150 "$PY" -m pytest -m gpu conformance/ -q --junitxml "$OUT/gpu-tests.xml"
step kernels 90 "${CB[@]}" kernels --out "$OUT/kernels.csv" --quick
step perf-sharegpt 150 "${CB[@]}" perf --device cuda --model "$MODEL" --workload sharegpt --num-prompts 200 \
  --seed 0 --batching continuous,static --max-num-seqs 64 --peers hf-static,hf-cb --warmup 4 \
  --result-dir "$OUT" --quiet
step perf-fixed 90 "${CB[@]}" perf --device cuda --model "$MODEL" --workload fixed \
  --workload-param input_len=1024,output_len=256 --num-prompts 64 --seed 0 --batching continuous,static \
  --max-num-seqs 16 --peers hf-static,hf-cb --warmup 4 --result-dir "$OUT" --quiet

cat "$OUT/summary.txt"
exit $status
