"""Record vLLM's own scheduler decisions on random traces, as the corpus conformance/test_recorded_traces.py replays.

    .venv-vllm/bin/python -m conformance.record_traces [--per-config N] [--out PATH]
    (or: bash ci/record_vllm_traces.sh, which builds .venv-vllm first)

Draws N traces for each of the 16 configurations the vLLM differential draws (fcfs/priority x prefix caching on/off x
chunked prefill on/off x sync/async scheduling), with the differential's own strategy (conformance.sched_traces),
derandomized so that a re-record draws the same traces. Each trace is driven through vLLM's V1 scheduler
(conformance/adapters/vllm_adapter.py) and written as one JSON line: the trace (knobs, requests, aborts, sampler seed)
and vLLM's record of every step and final outputs. The first line is a header naming the vLLM and torch versions.
Re-record when the pinned vLLM (ci/setup_vllm_env.sh) changes, and commit the new corpus with that pin.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import sys
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from conformance.sched_traces import drive, final_outputs
from conformance.trace_spec import EOS, Trace, traces

CORPUS = Path(__file__).parent / "traces" / "vllm_decisions.jsonl.gz"
CONFIGS = [
    dict(policy=p, prefix_caching=apc, chunked=ch, async_scheduling=asy)
    for p, apc, ch, asy in itertools.product(["fcfs", "priority"], [True, False], [True, False], [False, True])
]


def config_name(policy: str, prefix_caching: bool, chunked: bool, async_scheduling: bool) -> str:
    return "-".join(
        [
            policy,
            "apc" if prefix_caching else "noapc",
            "chunked" if chunked else "unchunked",
            "async" if async_scheduling else "sync",
        ]
    )


def draw_traces(config: dict, n: int, index: int) -> list[Trace]:
    """n traces from the differential's strategy for one configuration: a fixed search (same traces every run)."""
    drawn: list[Trace] = []

    @hypothesis_seed(1000 + index)
    @settings(
        max_examples=n,
        database=None,
        derandomize=False,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(trace=traces(**config))
    def collect(trace: Trace) -> None:
        drawn.append(trace)

    collect()
    return drawn[:n]


def record_one(trace: Trace) -> dict:
    """vLLM's decisions on one trace, as a JSON-ready dict."""
    from conformance.adapters.vllm_adapter import VLLMAdapter

    eng = VLLMAdapter(eos_token_id=EOS, **trace.knobs)
    steps = [rec.to_json() for rec in drive(eng, trace)]
    return {**trace.to_json(), "steps": steps, "final": final_outputs(eng, trace)}


def _stats(rows: list[dict]) -> dict:
    """How much of what the corpus is for it exercises: counted so that a re-record can be compared."""

    def any_step(row, i):
        return any(s[i] for s in row["steps"])

    ties = 0
    for row in rows:
        keys = [(r["priority"], r["arrival_time"]) for r in row["reqs"]]
        ties += len(keys) != len(set(keys))
    return {
        "traces": len(rows),
        "steps": sum(len(r["steps"]) for r in rows),
        "with_preemption": sum(any_step(r, 1) for r in rows),
        "with_exact_ties": ties,
        "with_aborts": sum(bool(r["aborts"]) for r in rows),
        "with_prefix_hits": sum(any(_hits_cache(s) for s in r["steps"]) for r in rows),
    }


def _hits_cache(step: list) -> bool:
    """Some request admitted this step starts with tokens it did not compute: prefix-cache hits."""
    sched, admitted, running = dict(step[0]), set(step[2]), step[4]
    return any(rid in admitted and computed > sched[rid] for rid, computed, _, _ in running)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.record_traces", description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-config", type=int, default=14, help="traces per configuration (16 configurations)")
    ap.add_argument("--out", type=Path, default=CORPUS)
    args = ap.parse_args(argv)
    if args.per_config < 1:
        print("--per-config must be >= 1", file=sys.stderr)
        return 2
    try:
        import torch
        import vllm
    except ImportError as e:
        print(f"recording needs vLLM (bash ci/setup_vllm_env.sh): {e}", file=sys.stderr)
        return 2
    rows = []
    for i, config in enumerate(CONFIGS):
        name = config_name(**config)
        for j, trace in enumerate(draw_traces(config, args.per_config, i)):
            rows.append({"id": f"{name}-{j:02d}", **record_one(trace)})
        print(f"{name}: {len(rows)} traces so far", file=sys.stderr)
    header = {
        "recorded_with": f"vllm {vllm.__version__}, torch {torch.__version__}",
        "command": f"python -m conformance.record_traces --per-config {args.per_config}",
        "fields": "steps: [sched, preempted, admitted, free, running, waiting, finished] (StepRecord)",
        "stats": _stats(rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(args.out, "wb", mtime=0) as f:  # mtime 0: the same decisions give the same bytes
        for row in [header] + rows:
            f.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
    print(json.dumps(header["stats"]), f"-> {args.out} ({args.out.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
