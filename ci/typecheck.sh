#!/usr/bin/env bash
# Strict mypy on the installed packages under their import names: refengine, and cbbench.kernels / cbbench.perf /
# cbbench.workloads, which are the folders kernels/, perf/ and workloads/ (setup.py maps them). mypy cannot follow
# that mapping, so it reads a tree of links that spells the import names (build/typecheck/, rebuilt each run).
# Settings in pyproject.toml [tool.mypy]. Usage: bash ci/typecheck.sh [VENV]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
MYPY=$(cd "$VENV/bin" && pwd)/mypy
tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree/cbbench"
for folder in kernels perf workloads; do
  ln -s "../../../$folder" "$tree/cbbench/$folder"
done
ln -s ../../refengine "$tree/refengine"
cd "$tree"
exec "$MYPY" --config-file ../../pyproject.toml
