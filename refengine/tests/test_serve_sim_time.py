"""Issue 26's check, small: a simulated H200 served over HTTP, at more streams than this host can write in real time,
measured by the openai backend (times converted to the server's simulated time) agrees with the same workload
simulated in-process. The server runs in a thread of the test process, so its event loop, its engine thread and
the client share one GIL: paced in real time, the served TPOT here came out 1.3 times the in-process one (the
pacer before the time scale) and 2.6 times (this pacer at time_scale=1.0); at the adaptive scale, within 1.5%.
benchmarks.sim_serving is the full-size version (512 ShareGPT prompts at 256 streams)."""

from __future__ import annotations

import pytest

from cbbench.perf.backends.http_client import HttpTarget
from cbbench.perf.backends.http_run import run_http
from cbbench.perf.backends.in_process import run_refengine
from cbbench.perf.knobs import EngineKnobs
from cbbench.workloads.workload import Workload, WorkloadRequest
from refengine import LLMEngine
from refengine.tests.live_server import live_server

MODEL, DEVICE = "llama-3.1-8b", "sim:h200"
NUM_STREAMS, PROMPT_LEN, OUTPUT_LEN = 64, 32, 128
# The bar: served TPOT (in simulated time) within 10% of in-process TPOT.
TPOT_TOLERANCE = 0.10


def _workload() -> Workload:
    reqs = [
        WorkloadRequest([100 + i] + [1000 + (7 * i + j) % 5000 for j in range(PROMPT_LEN - 1)], OUTPUT_LEN)
        for i in range(NUM_STREAMS)  # distinct first tokens: no prefix-cache sharing between requests
    ]
    return Workload("fixed", {}, reqs)


def _mean_tpot_ms(result) -> float:
    return float(result.metrics(metric_percentiles=[50], goodput=None)["mean_tpot_ms"])


# A benchmark, out of the default run: the served TPOT is the client's wall-clock times mapped to simulated time, so
# a loaded host (the client, the server's event loop and its engine thread behind one GIL) stretches it: at load 3-5
# on the shared 2-core machine it came out 8.6 ms against 6.6 in-process (issue 47), a failure of a correct tree.
# Run it with `pytest -m slow refengine/tests/test_serve_sim_time.py` on a quiet machine (or the full-size
# benchmarks.sim_serving); the default run keeps refengine/tests/test_serve_sim_clock.py's checks of the
# served clock itself, which count and order rather than time.
@pytest.mark.slow
def test_served_tpot_in_simulated_time_matches_in_process_at_more_streams_than_the_host_keeps_up_with():
    workload = _workload()
    args = EngineKnobs().engine_args(model=MODEL, device=DEVICE, dtype=None, seed=0, batching="continuous")
    inproc = run_refengine(workload, engine_args=args, knobs=EngineKnobs(), warmup=0, max_concurrency=NUM_STREAMS)
    with live_server(LLMEngine(MODEL, device=DEVICE)) as live:  # the adaptive time scale: serve's default
        served = run_http(
            workload, HttpTarget("openai", live.url, MODEL, prompt_format="ids"), max_concurrency=NUM_STREAMS, warmup=0
        )
    assert served.error is None and not served.failures
    assert [r.output_len for r in served.records] == [OUTPUT_LEN] * NUM_STREAMS
    expected, got = _mean_tpot_ms(inproc), _mean_tpot_ms(served)
    assert abs(got - expected) <= TPOT_TOLERANCE * expected, (got, expected, getattr(served, "time_note", None))
