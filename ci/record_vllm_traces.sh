#!/usr/bin/env bash
# Re-record vLLM's decisions on the scheduler traces that conformance/test_recorded_traces.py replays, when the pinned
# vLLM (ci/setup_vllm_env.sh) changes:   bash ci/record_vllm_traces.sh [VENV] [--per-config N]
# Builds the vLLM environment if it is missing, records conformance/traces/vllm_decisions.jsonl.gz, then replays it
# against vLLM itself (it must agree with its own recording) and against refengine (a difference is a finding:
# either refengine follows the new vLLM, or the difference is argued in test_vllm_differential.py).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
shift || true
[ -x "$venv/bin/python" ] || bash ci/setup_vllm_env.sh "$venv"
"$venv/bin/python" -m conformance.record_traces "$@"
"$venv/bin/python" -m pytest conformance/test_recorded_traces.py -q -p no:cacheprovider --engine vllm
"$venv/bin/python" -m pytest conformance/test_recorded_traces.py -q -p no:cacheprovider
