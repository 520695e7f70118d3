#!/usr/bin/env bash
# Build the environment that runs vLLM's own V1 scheduler on the CPU, for conformance/test_vllm_differential.py and
# `pytest conformance/ --engine vllm`:   bash ci/setup_vllm_env.sh [VENV]   (default .venv-vllm)
#
# vLLM is not a cbbench dependency and never goes into the project's own venv: a plain `pip install vllm` pulls a
# CUDA torch and ~9 GB. Order matters: the CPU torch 2.13.0 first (pip takes it from the wheel on disk; vllm 0.33.0
# itself asks for torch==2.14.0, hence --no-deps for vllm), then the pinned pure-Python closure with --no-deps, then
# vllm==0.33.0 with --no-deps, then cbbench itself (editable, --no-deps) so that refengine and cbbench.* import.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
venv="${1:-.venv-vllm}"
start=$(date +%s)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" --no-deps -r ci/vllm-requirements.txt
"${pip[@]}" --no-deps "vllm==0.33.0"
"${pip[@]}" --no-deps -e "$repo"
"$venv/bin/python" - <<'PY'
import torch, vllm
import vllm.v1.core.sched.scheduler  # noqa: F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"vllm {vllm.__version__} with torch {torch.__version__}: scheduler importable")
PY
echo "$venv ready in $(( $(date +%s) - start ))s; run: $venv/bin/pytest conformance/ --engine vllm"
