#!/usr/bin/env bash
# Build the environment that runs SGLang's own scheduler on the CPU, for `pytest conformance/ --engine sglang`:
#   bash ci/setup_sglang_env.sh [VENV]   (default .venv-sglang)
#
# SGLang is not a cbbench dependency and never goes into the project's own venv: a plain `pip install sglang`
# resolves the CUDA stack (and torchvision, whose build needs CUDA), so it is never run. Order matters: the CPU
# torch 2.13.0 first (pip takes it from the wheel on disk), then the pinned pure-Python closure of what SGLang's
# scheduler imports (ci/sglang-requirements.txt) with --no-deps, then sglang==0.5.23 with --no-deps, then cbbench
# itself (editable, --no-deps) so that conformance/ imports. sgl_kernel (its CUDA kernels) is never installed: the
# adapter stubs it as SGLang's own CPU-only unit tests do (sglang.test.test_utils.maybe_stub_sgl_kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
venv="${1:-.venv-sglang}"
start=$(date +%s)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" --no-deps -r ci/sglang-requirements.txt
"${pip[@]}" --no-deps "sglang==0.5.23"
"${pip[@]}" --no-deps -e "$repo"
"$venv/bin/python" - <<'PY'
import torch
from conformance.adapters.sglang_adapter import SGLangAdapter
import sglang
assert torch.__version__.startswith("2.13.0"), torch.__version__
SGLangAdapter(eos_token_id=0)  # builds SGLang's scheduler, pools and radix cache on the CPU
print(f"sglang {sglang.__version__} with torch {torch.__version__}: scheduler built")
PY
echo "$venv ready in $(( $(date +%s) - start ))s ($(du -sh "$venv" | cut -f1)); run: $venv/bin/pytest conformance/ --engine sglang"
