#!/usr/bin/env bash
# Create a virtual environment with cbbench and its test tools: `bash ci/setup.sh [VENV]` (default .venv).
# Without an NVIDIA GPU, torch is pinned to the 2.13.0 CPU wheel: an unpinned resolve would pull a
# multi-gigabyte CUDA build onto a machine that cannot use it. With a GPU, pip keeps or picks a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "${pip[@]}" "torch>=2.4"
else
  "${pip[@]}" "torch==2.13.0"
fi
# ray: the Ray executor's tests run in CI too (perf/tests/test_grid_rows.py); about 25 s and 250 MB more
"${pip[@]}" -e ".[test,ray]"
echo "cbbench installed in $venv ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
