#!/usr/bin/env bash
# Every GPU check and benchmark as one prepared command for a fresh GPU box (only this repo, no network): its own
# setup, under 8 minutes in all (a card lent for 15 minutes can run it, be read, and run it again), everything it
# writes packed into OUTDIR as at most 8 files (so one call of a lent machine runs it and brings it back), the perf
# baseline results/baselines/<gpu>.csv (h200.csv on an H200), and last an A/A `cbbench gate` on the card (the same
# code on both arms: a FAIL there is a false alarm, so the first card that runs this measures the gate's false-alarm
# rate on a GPU).
#
#   bash ci/gpu_check.sh [--dry-run] [OUTDIR]        (OUTDIR default results/gpu-check)
#
# Steps, each under its own time limit (one that hangs cannot eat the others' time; all run even if one fails),
# never past the deadline (TOTAL_S, default 470 s, setup included; the pack follows it: 480 s in all). The budget, on
# an H200, from its first runs (../shared/gpu notes, 2026-12-04: gpu-tests 53 s for 20 tests, kernels --quick 12 s,
# bench-step 9 s, calibration 10 s; perf-*.csv durations) and estimates where none was measured (~):
#   setup            60  venv on the image's torch, offline wheels (ci/gpu_wheels.sh), pip -e        ~30-60 s
#   gpu-tests        90  pytest -m gpu in ONE process (-p no:xdist: each engine has the card to itself), every
#                        engine's KV sized: the 20 tests that ran in 53 s, plus test_gpu_paths.py (~15 engines of
#                        the test model, ~1-3 s each with graph capture; 4 of qwen2.5-0.5b, ~6 s each)     ~85 s
#   kernels          22  cbbench kernels, the whole sweep (32 shapes), each timed by CUDA-graph replay:
#                        20 launches x 10 replays x 3 samples, <0.3 s a shape, plus compiles (the quick sweep's
#                        3 shapes took 12 s, mostly compiles)                                              ~20 s
#   bench-step       10  --stub-model on CUDA at 64 / 256 running, 100 steps each (host time per step), and
#                        the same with a 128-token prefill beside the decodes (mixed / decode-only): 9 s measured
#   bench-step-real  10  --real-model qwen2.5-0.5b on CUDA at 64 / 256 running, 50 steps each            ~9 s
#   launches         12  kernel launches per layer (torch.profiler) of qwen2.5-0.5b, eager: torch and
#                        triton paths and the transformers twin                                           ~10 s
#   perf-qwen        80  qwen2.5-0.5b, one process (weights drawn once), 256 slots, continuous + static:
#                        ShareGPT 1000 prompts: 19.6 + 19.1 s measured, + 2 engine starts (~6 s)           ~45 s
#                        fixed 1024/256, 512 prompts: half of 12.4 + 11.7 s measured for 1000, + starts     ~18 s
#                        hf-static (+ refengine static) on 16 ShareGPT prompts, outputs <= 256: HF load ~5 s,
#                        <= 256 steps at ~25 ms                                                              ~11 s
#                        the decode step at 256 running over its floor (benchmarks/step_floor.py)            ~4 s
#   perf-llama       90  llama-3.1-8b, one process, 256 slots, continuous + static: weights drawn once
#                        (8e9 values on the CPU, ~45 s); ShareGPT 320 prompts: 5.8k / 3.5k out tok/s
#                        measured at 1000, ~61k output tokens -> 11 + 18 s, + 2 starts (~8 s)                ~37 s
#                        the decode step at 256 running over its floor                                       ~8 s
#                        (no fixed 1024/256 run of the 8B: its ~36 s do not fit 8 minutes; the 0.5B's
#                        fixed run measures the forward's own speed)
#   record            5  the perf CSVs as one baseline (python -m benchmarks.gpu_runs merge)
#   calibration-qwen 12  the ShareGPT runs again on sim:<gpu> (benchmarks/sim_calibration.py): real /
#                        simulated per configuration; 10 s measured for 256 prompts of the 0.5B             ~12 s
#   calibration-llama 8  the same for the 8B's 320 prompts                                                ~8 s
#   gate-aa          70  cbbench gate A/A of a snapshot of this checkout (python -m benchmarks.gate_power
#                        aa): qwen2.5-0.5b, 64 ShareGPT prompts on 64 slots, output throughput alone gated
#                        (one test: 3 runs per arm are the fewest with which it can find anything at 95 %),
#                        6 runs, each a fresh process: start, weights, engine and warm-up ~8 s, the run
#                        ~1 s, + the arms' preflight (~2 x 3 s) (not measured on a card yet)               ~60 s
#   = 60 + 90 + 22 + 10 + 10 + 12 + 80 + 90 + 5 + 12 + 8 + 70 = 469 s <= TOTAL_S 470; the pack (tar of the logs)
#   follows the deadline (~2 s, 10 allowed): 480 s = 8 minutes. 1000 ShareGPT prompts on the 8B (87 s of generation
#   measured, both modes) do not fit beside the rest: with 320 on 256 slots static still runs a second,
#   quarter-full batch that continuous batching fills as requests finish.
# Written to OUTDIR (at most 8 files): summary.txt (each step's exit and seconds, pytest's and every run's lines),
# gpu.txt (device, driver, versions), <gpu>.csv (the baseline, also copied to results/baselines/ when every run
# finished and RECORD is not 0), kernels.csv, calibration-qwen.csv, calibration-llama.csv, logs.tar.gz (every
# step's log, the runs' CSVs and JSONs, the junit XML, the A/A gate's results and verdict; its verdict line is in
# summary.txt too). Work files go to WORK (default /tmp/cbbench-gpu-check).
# --dry-run: print the plan (python found, steps, limits, commands) and run nothing; works on a CPU machine.
# Env: PYTHON (a python3 with CUDA torch), WHEELHOUSE (wheels of missing packages), VENV (default .venv-gpu-check),
#      TOTAL_S, WORK, RECORD (0: leave results/baselines/ alone), LIMIT_PCT (every step's limit in percent of the
#      budget's, default 100: on a card whose times are not known yet, a run with LIMIT_PCT=150 TOTAL_S=600
#      measures every step whole, and its summary's seconds set the budget). Exit: 0 when every step passed, 1 when one failed,
#      2 when setup failed.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
ARGS=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,62p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $a" >&2; exit 2 ;;
    *) ARGS+=("$a") ;;
  esac
done
OUT=${ARGS[0]:-results/gpu-check}
VENV=${VENV:-.venv-gpu-check}
TOTAL_S=${TOTAL_S:-470}
WORK=${WORK:-${TMPDIR:-/tmp}/cbbench-gpu-check}
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
if [[ $DRY_RUN != 1 ]]; then
  rm -rf "$WORK"
  mkdir -p "$OUT" "$WORK"
  : > "$WORK/summary.txt"
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    "$PY" ci/gpu_probe.py versions 2>&1; } > "$WORK/gpu.txt"
  echo "setup seconds=$SECONDS" >> "$WORK/summary.txt"
fi

step() {  # step NAME SECONDS CMD...: run under min(SECONDS, time left before the deadline)
  local name=$1 limit=$(( $2 * ${LIMIT_PCT:-100} / 100 )); shift 2
  local left=$((DEADLINE - SECONDS))
  (( limit > left )) && limit=$left
  if [[ $DRY_RUN == 1 ]]; then
    echo "step $name limit=${limit}s: $*"
    return 0
  fi
  if (( left <= 3 )); then
    echo "$name rc=skipped seconds=0 (deadline reached)" | tee -a "$WORK/summary.txt"; status=1; return 1
  fi
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  PYTHONUNBUFFERED=1 timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$WORK/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$WORK/summary.txt"
  [[ $rc == 0 ]] || status=1
  return "$rc"
}

group_names() {  # the @NAMEs of a runs array
  local a
  for a in "$@"; do [[ $a == @* ]] && echo "${a#@}"; done
}

group_args() {  # NAME RUNS...: the perf arguments of one group, with the device replaced by $SIM_DEVICE
  local name=$1 a in=0; shift
  for a in "$@"; do
    if [[ $a == @* ]]; then [[ $a == "@$name" ]] && in=1 || in=0; continue; fi
    (( in )) && { [[ $a == cuda ]] && echo "$SIM_DEVICE" || echo "$a"; }
  done
}

# one process, not xdist workers: every engine on the card in turn (each asking for its share of the whole card)
step gpu-tests 90 "$PY" -m pytest -m gpu -p no:xdist -p no:cacheprovider -o addopts= -q \
  conformance/ perf/tests/ refengine/tests/ --junitxml "$WORK/gpu-tests.xml"
step kernels 22 "${CB[@]}" kernels --out "$WORK/kernels.csv"
step bench-step 10 "${CB[@]}" bench-step --stub-model --device cuda --running 64,256 --iters 100 \
  --mixed-prompt-len 128
step bench-step-real 10 "${CB[@]}" bench-step --real-model --model qwen2.5-0.5b --device cuda --running 64,256 \
  --iters 50
PERF=$WORK/perf
step launches 12 "$PY" -m benchmarks.launches --model qwen2.5-0.5b --triton-model qwen2.5-0.5b
step perf-qwen 80 "$PY" -m benchmarks.gpu_runs perf "$PERF" --floor qwen2.5-0.5b:256:400 \
  "${GPU_QWEN_RUNS[@]}"
step perf-llama 90 "$PY" -m benchmarks.gpu_runs perf "$PERF" --floor llama-3.1-8b:256:400 \
  "${GPU_LLAMA_RUNS[@]}"

# the baseline: every run of both models; a partial one (a run failed or ran out of time) is left in OUTDIR only,
# and the step fails
PARTS=()
for name in $(group_names "${GPU_QWEN_RUNS[@]}" "${GPU_LLAMA_RUNS[@]}"); do PARTS+=("$PERF/$name.csv"); done
if step record 5 "$PY" -m benchmarks.gpu_runs merge "$WORK/$GPU.csv" "${PARTS[@]}" \
    && [[ $DRY_RUN != 1 && ${RECORD:-1} != 0 ]]; then
  cp "$WORK/$GPU.csv" "$BASELINE" && echo "recorded $BASELINE (commit it)" | tee -a "$WORK/summary.txt"
fi
SIM_DEVICE=sim:$GPU  # the same workload on the simulated twin of this GPU
mapfile -t QWEN_SIM < <(group_args qwen0.5b-sharegpt "${GPU_QWEN_RUNS[@]}")
mapfile -t LLAMA_SIM < <(group_args llama8b-sharegpt "${GPU_LLAMA_RUNS[@]}")
step calibration-qwen 12 "$PY" -m benchmarks.sim_calibration "$PERF/qwen0.5b-sharegpt.csv" \
  "$WORK/calibration-qwen" "${QWEN_SIM[@]}"
step calibration-llama 8 "$PY" -m benchmarks.sim_calibration "$PERF/llama8b-sharegpt.csv" \
  "$WORK/calibration-llama" "${LLAMA_SIM[@]}"

# last, an A/A gate on the card: a snapshot of this checkout's files gated against itself (no git history needed)
step gate-aa 70 "$PY" -m benchmarks.gate_power aa "$WORK/gate-aa.csv" -- --model qwen2.5-0.5b --device cuda \
  --num-prompts 64 --max-num-seqs 64 --warmup 2 --repeats 3 --min-effect off --min-effect output_throughput=1.5% \
  --on-inconclusive pass

[[ $DRY_RUN == 1 ]] && { echo "dry run: nothing was run"; exit 0; }
# pack: at most 8 files in OUTDIR
{
  echo "== pytest"; tail -n 1 "$WORK/gpu-tests.log" 2>/dev/null
  echo "== runs"; "$PY" -m benchmarks.gpu_runs summary "${PARTS[@]}" 2>&1
  echo "== A/A gate"; grep -h "^A/A gate" "$WORK/gate-aa.log" 2>/dev/null || echo "A/A gate: no verdict (see its log)"
} >> "$WORK/summary.txt"
cp "$WORK/summary.txt" "$WORK/gpu.txt" "$OUT/"
for f in "$WORK/$GPU.csv" "$WORK/kernels.csv"; do [[ -f $f ]] && cp "$f" "$OUT/"; done
for c in qwen llama; do
  [[ -f $WORK/calibration-$c/calibration.csv ]] && cp "$WORK/calibration-$c/calibration.csv" "$OUT/calibration-$c.csv"
done
tar czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
echo "== $OUT"; ls "$OUT"
cat "$OUT/summary.txt"
exit $status
