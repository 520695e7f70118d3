#!/usr/bin/env bash
# Strict mypy on the installed packages, read where they lie: refengine/ and cbbench/ (cbbench.kernels,
# cbbench.perf, cbbench.workloads), and on benchmarks/ beside them. Settings in pyproject.toml [tool.mypy]. Usage: bash ci/typecheck.sh [VENV]
# (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
exec "$VENV/bin/mypy" --config-file pyproject.toml
