"""`--client-workers N`: one HTTP run sharded over client processes; the records come back whole, in request order,
with every timestamp on the parent's clock (CLOCK_MONOTONIC is one clock for the whole system)."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from benchmarks.fake_openai_server import FakeOpenAIServer
from cbbench.perf.backends.client_workers import shard_concurrency
from cbbench.perf.backends.http_client import HttpTarget
from cbbench.perf.backends.http_run import run_http
from cbbench.perf.cli import app
from cbbench.workloads.workload import Workload, WorkloadRequest

TOKEN_DELAY_S = 0.02
NUM_REQUESTS = 10
# Each request is due no sooner than the shared epoch plus its offset, whichever worker sends it (later where
# --max-concurrency holds it back), and is sent no sooner than it is due: lower bounds, since a loaded machine only
# sends later. (A slack above the schedule, as before, was a bound load alone could exceed; a worker on another
# clock puts its stamps outside the run's [before, after], checked below.)
SCHEDULE_EXACT_S = 1e-6  # float rounding of epoch + offset
EARLY_S = 0.002  # asyncio's timers may fire up to the clock's resolution early


def _workload() -> Workload:
    # a different output length per request, so that a record merged under the wrong id shows
    reqs = [WorkloadRequest([1, 2, 3 + i], 2 + i % 4, arrival_time=0.01 * i) for i in range(NUM_REQUESTS)]
    return Workload("manual", {"num_prompts": NUM_REQUESTS}, reqs)


def test_two_workers_merge_records_on_one_clock():
    with FakeOpenAIServer(token_delay_s=TOKEN_DELAY_S) as s:
        before = time.perf_counter()
        r = run_http(
            _workload(), HttpTarget("openai", s.base_url, "fake-model"), warmup=0, client_workers=2, max_concurrency=4
        )
        after = time.perf_counter()
        assert s.completed == NUM_REQUESTS and s.peak_in_flight <= 4
    assert r.error is None, r.error
    assert [rec.request_id for rec in r.records] == [str(i) for i in range(NUM_REQUESTS)]
    assert [rec.output_len for rec in r.records] == [2 + i % 4 for i in range(NUM_REQUESTS)]
    t0 = r.records[0].scheduled_time  # the epoch: the first request is due at once
    for i, rec in enumerate(r.records):
        assert before < rec.arrival_time < rec.first_token_time <= rec.finish_time < after
        # due at its own offset from the shared epoch or later, whichever worker sent it, and never sent early
        assert rec.scheduled_time - t0 >= 0.01 * i - SCHEDULE_EXACT_S, (i, rec.scheduled_time - t0)
        assert rec.arrival_time >= rec.scheduled_time - EARLY_S
        # the fake server waits one token delay before each token: the first can come no sooner
        assert rec.first_token_time - rec.arrival_time >= TOKEN_DELAY_S
        assert len(rec.chunk_times) >= 1 and rec.chunk_times == sorted(rec.chunk_times)
    assert 0 < r.duration < after - before
    assert r.metrics(metric_percentiles=[50], goodput=None)["completed"] == NUM_REQUESTS


def test_concurrency_is_split_over_workers():
    assert shard_concurrency(None, 3) == [None, None, None]
    assert shard_concurrency(10, 4) == [3, 3, 2, 2]
    assert shard_concurrency(2, 4) == [1, 1]  # never more workers than requests in flight


def test_bad_worker_count_is_one_line(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "perf",
            "--backend",
            "openai",
            "--base-url",
            "http://127.0.0.1:9",
            "--client-workers",
            "0",
            "--result-dir",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 2 and "--client-workers: expected an integer >= 1" in res.output  # the flag, as typed
    assert len(res.output.strip().splitlines()) == 1
