#!/usr/bin/env bash
# Lint gate, run before pytest: ruff's lint rules, ruff's formatting check and strict mypy on refengine/, kernels/,
# workloads/, perf/ and benchmarks/ (their tests aside). No line-count limits: a module is as long as its one concept
# needs.
# pyproject.toml holds every ruff and mypy setting, mypy's file list included. Fast; every check runs, and any
# failure fails the gate (exit 1).
# Usage: bash ci/lint.sh [VENV]   (default .venv, as made by ci/setup.sh with the `test` extra, which pins ruff
# and mypy)
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
rc=0
step() {
  echo "== $*"
  "$@" || rc=1
}
step "$VENV/bin/ruff" check .
step "$VENV/bin/ruff" format --check .
step bash ci/typecheck.sh "$VENV"
exit "$rc"
