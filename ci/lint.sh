#!/usr/bin/env bash
# Lint gate, run by .ci/run before pytest: ruff's lint rules, ruff's formatting check, and mypy (strict on the
# engine and the perf results layer; pyproject.toml holds every setting). Fast, and any failure fails the run.
# Usage: bash ci/lint.sh [VENV]   (default .venv, as made by ci/setup.sh with the `test` extra)
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
rc=0
"$VENV/bin/ruff" check . || rc=1
"$VENV/bin/ruff" format --check . || rc=1
# perf/results may not exist yet on every branch: check only the paths that are there
paths=()
for p in refengine perf/results; do [[ -e $p ]] && paths+=("$p"); done
"$VENV/bin/mypy" "${paths[@]}" || rc=1
exit "$rc"
