#!/usr/bin/env bash
# Peer simulators on cbbench's measured rows (issue 26): Vidur 0.0.26 and aiconfigurator 0.12.0 each predict every
# row of perf/sim/data/measured_runs.csv they can, into one CSV beside cbbench's own predictions:
#     bash ci/peer_sims.sh [OUT]        (default perf/sim/data/peer_predictions.csv; docs/peer-simulators.md)
#
# Like the vLLM peer (ci/setup_vllm_env.sh), neither peer is a cbbench dependency: each gets its own venv outside
# git's view (.venv-vidur, .venv-aiconfigurator; both in .gitignore), made once from a pinned dependency closure
# (ci/peer_sims/*-requirements.txt, installed --no-deps, so a rerun resolves nothing) and reused while the pinned
# version is there. Installing needs the package index; predicting needs no network (HF_HUB_OFFLINE=1). Not run in
# CI: about 8 minutes on 2 cores, nearly all of it aiconfigurator's 219 estimates. Each peer's log goes to a
# temporary folder named at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-perf/sim/data/peer_predictions.csv}"
python="${PYTHON:-python3}"
start=$(date +%s)
# vidur 0.0.26 ships one binary wheel, for CPython 3.11
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || { echo "peer_sims: needs Python 3.11 (vidur 0.0.26's only wheel); set PYTHON" >&2; exit 2; }

peer_venv() {  # VENV PACKAGE VERSION: the venv with PACKAGE==VERSION and its pinned closure, made if missing
  local venv="$1" package="$2" version="$3" have
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  have=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$package'))" 2>/dev/null || true)
  if [ "$have" != "$version" ]; then
    echo "== $venv: installing $package==$version"
    local pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps)
    "${pip[@]}" -r "ci/peer_sims/$package-requirements.txt"
    if [ "$package" = aiconfigurator ]; then "${pip[@]}" "aiconfigurator-core==$version"; fi
    "${pip[@]}" "$package==$version"
  fi
}
peer_venv .venv-aiconfigurator aiconfigurator 0.12.0
peer_venv .venv-vidur vidur 0.0.26

work=$(mktemp -d -t peer-sims-XXXXXX)
export HF_HUB_OFFLINE=1
run_peer() {  # NAME: its runner in its venv, its rows to $work/NAME.csv, its stderr to $work/NAME.log
  echo "== $1"
  if ! ".venv-$1/bin/python" "ci/peer_sims/$1_rows.py" "$work/$1.csv" 2>"$work/$1.log"; then
    tail -n 20 "$work/$1.log" >&2
    echo "peer_sims: the $1 runner failed (log: $work/$1.log)" >&2
    exit 1
  fi
}
run_peer vidur
run_peer aiconfigurator
"$python" ci/peer_sims/merge.py "$out" "$work/vidur.csv" "$work/aiconfigurator.csv" --seconds $(($(date +%s) - start))
echo "logs: $work"
