"""The harness checks its own clock: the HTTP client's TTFT and ITL against a fake server whose TTFT, ITL and token
counts are known, where its output token counts come from, and whether it reports its own lateness (the schedule
delay, perf/client_lag.py) and the steady-state window (perf/steady_state.py).

The fake server (benchmarks/fake_openai_server.py, a thread of this process) sends a request's first chunk one
`CLOCK_DELAY_S` after the request and each later chunk one more after that, so the truth is TTFT = ITL =
CLOCK_DELAY_S; what the client measures beyond it is the client's error (and, on a busy machine, the fake server's
own late wake-ups, which only make these bounds stricter than they need be).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import pytest
from typer.testing import CliRunner

from benchmarks.fake_openai_server import FakeOpenAIServer
from cbbench.perf.backends.http_client import HttpTarget, stream_request
from cbbench.perf.backends.http_run import run_http
from cbbench.perf.cli import app
from cbbench.perf.client_lag import CLIENT_LAG_MS, arms_lag_notes, lag_line, lagged
from cbbench.perf.metrics import request_latencies
from cbbench.perf.records import RequestRecord
from cbbench.perf.report.table import summary_lines, table_columns
from cbbench.perf.steady_state import NOTE_COLUMN, steady_metrics
from cbbench.workloads.workload import Workload, WorkloadRequest

# The fake server's time per chunk: long beside what a client adds on a busy 2-core machine (docs/client-scaling.md:
# 4 ms of TTFT error and 0.8 ms of ITL error with one request in flight when quiet; 44 ms and 12 ms beside ~10
# CPU-bound processes), short enough that the test takes about two seconds.
CLOCK_DELAY_S = 0.1
CLOCK_OUTPUT_LEN = 6
CLOCK_REQUESTS = 3
# A correct client is within this of the truth, median over the requests, one request in flight at a time: half
# the chunk time. What a wrong clock makes of it is far beyond: TTFT timed from the run's start instead of the
# send is a whole request (0.6 s) too long from the second request on; chunk times stamped when the body ends give
# ITL ~0 (0.1 s too short). Measured on this machine: docs/perf.md, "The client's own clock".
TTFT_ERROR_BOUND_S = 0.05
ITL_ERROR_BOUND_S = 0.05
# The server cannot send a chunk before its delay has passed; asyncio's timers may fire up to the clock's
# resolution early, so a correct TTFT may read that much under the truth, never more.
EARLY_S = 0.002


def _workload(n: int, output_len: int, arrivals: list[float] | None = None) -> Workload:
    reqs = [WorkloadRequest([1, 2, 3, 4], output_len, arrival_time=a) for a in (arrivals or [0.0] * n)]
    return Workload("manual", {"num_prompts": n}, reqs)


def clock_errors(records: list[RequestRecord], truth_s: float) -> tuple[float, float]:
    """(median TTFT error, median ITL error) in seconds over the completed records."""
    lat = [request_latencies(r) for r in records if r.finish_reason != "error"]
    ttft = [d["ttft"] - truth_s for d in lat if d["ttft"] is not None]
    itl = [g - truth_s for d in lat for g in d["itl"]]
    return statistics.median(ttft), statistics.median(itl)


def test_client_stamps_each_send_and_each_chunk():
    """The default suite's form of the clock check below, which load cannot fail: the order of each request's
    stamps (sent, first chunk, ..., finished; one request in flight, so each is sent after the one before it
    finished) and lower bounds set by the fake server, which cannot send a chunk before its delay has passed (a
    busy machine only makes the times since the send longer; not each gap: a client that reads one chunk late reads
    the next at once). A TTFT timed from the run's start sends request k before request k - 1 finished; chunk
    times stamped once when the body ends are all equal, where each read stamps its own."""
    w = _workload(CLOCK_REQUESTS, CLOCK_OUTPUT_LEN)
    with FakeOpenAIServer(token_delay_s=CLOCK_DELAY_S, with_metrics=False) as s:
        r = run_http(w, HttpTarget("openai", s.base_url, "fake-model"), max_concurrency=1, warmup=1)
    assert r.error is None and all(x.finish_reason != "error" for x in r.records)
    recs = sorted(r.records, key=lambda x: x.arrival_time)
    for before, after in zip(recs, recs[1:]):
        assert before.finish_time <= after.arrival_time, "a request was stamped as sent before its slot was free"
    for x in recs:
        stamps = [x.arrival_time, x.first_token_time, *x.chunk_times, x.finish_time]
        assert stamps == sorted(stamps) and x.first_token_time == x.chunk_times[0], stamps
        assert len(set(x.chunk_times)) == len(x.chunk_times) == CLOCK_OUTPUT_LEN, x.chunk_times  # one stamp each
        # chunk j cannot be read before j + 1 of the server's delays have passed since the send
        for j, t in enumerate(x.chunk_times):
            assert t - x.arrival_time >= (j + 1) * (CLOCK_DELAY_S - EARLY_S), (j, t - x.arrival_time)


@pytest.mark.slow  # a timing benchmark (docs/perf.md): load alone adds tens of ms to a client's error
def test_client_ttft_and_itl_error_at_low_concurrency_is_within_bound():
    w = _workload(CLOCK_REQUESTS, CLOCK_OUTPUT_LEN)
    with FakeOpenAIServer(token_delay_s=CLOCK_DELAY_S, with_metrics=False) as s:
        r = run_http(w, HttpTarget("openai", s.base_url, "fake-model"), max_concurrency=1, warmup=1)
    assert r.error is None and all(x.finish_reason != "error" for x in r.records)
    ttft_err, itl_err = clock_errors(r.records, CLOCK_DELAY_S)
    assert -EARLY_S <= ttft_err <= TTFT_ERROR_BOUND_S, f"median TTFT error {ttft_err * 1e3:.1f} ms"
    assert abs(itl_err) <= ITL_ERROR_BOUND_S, f"median ITL error {itl_err * 1e3:.1f} ms"


class _CharTokenizer:
    """Counts a token per character: a re-tokenised count that is never the server's."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_output_tokens_come_from_usage_or_token_ids_never_from_chunks_or_text():
    """Several tokens per chunk (inference-perf issue 564): counting chunks gives a third, re-tokenising the text
    gives ~4x; the server's usage, or the token ids it streamed, give the truth."""
    n, per_chunk = 9, 3
    w = _workload(2, n)
    target = lambda s: HttpTarget("openai", s.base_url, "fake-model")  # noqa: E731
    with FakeOpenAIServer(token_delay_s=0.002, chunk_tokens=per_chunk, with_token_ids=True) as s:
        with_usage = run_http(w, target(s), tokenizer=_CharTokenizer(), warmup=0)
    with FakeOpenAIServer(token_delay_s=0.002, chunk_tokens=per_chunk, with_token_ids=True, with_usage=False) as s:
        with_ids = run_http(w, target(s), tokenizer=_CharTokenizer(), warmup=0)
    assert {(r.output_len, r.output_len_source) for r in with_usage.records} == {(n, "usage")}
    assert {(r.output_len, r.output_len_source) for r in with_ids.records} == {(n, "token_ids")}
    assert {len(r.chunk_times or []) for r in with_ids.records} == {n // per_chunk}  # ITL is per chunk, as vLLM's


LATE_S = 0.04  # the planted client blocks its event loop this long before each send
GAP_S = 0.01  # the schedule: one request every 10 ms (100 req/s)


def test_a_late_client_is_flagged_by_its_schedule_delay():
    late_by = []

    async def late_send(*args: Any) -> RequestRecord:
        time.sleep(LATE_S)  # a client too busy to send on time (parsing other streams, no free core)
        late_by.append(LATE_S)
        return await stream_request(*args)

    n = 8
    w = _workload(n, 2, [i * GAP_S for i in range(n)])
    w.params["request_rate"] = 1 / GAP_S
    with FakeOpenAIServer(token_delay_s=0.002, with_metrics=False) as s:
        r = run_http(w, HttpTarget("openai", s.base_url, "fake-model"), warmup=0, send=late_send)
    assert len(late_by) == n and all(x.finish_reason != "error" for x in r.records)
    delays = [x.arrival_time - x.scheduled_time for x in sorted(r.records, key=lambda x: x.scheduled_time)]
    # each blocked send pushes every later one back: request k goes out at least k x (LATE_S - GAP_S) late
    assert all(d >= k * (LATE_S - GAP_S) for k, d in enumerate(delays)), delays
    m = r.metrics(metric_percentiles=[50], goodput=None)
    assert m["median_schedule_delay_ms"] >= CLIENT_LAG_MS and lagged(m)
    assert m["achieved_request_rate"] < 1 / GAP_S
    line = lag_line("openai", [{**m, "request_rate": 1 / GAP_S}])
    assert line is not None and "client lagged" in line and "of 100 requested" in line


def test_waiting_for_a_concurrency_slot_is_not_schedule_delay():
    """Under --max-concurrency 1 every request after the first waits for the one before it: it is due when that
    one's slot frees, not at t0, so the wait (the cap's) does not count as the client's lateness."""
    w = _workload(4, 3)
    with FakeOpenAIServer(token_delay_s=0.01, with_metrics=False) as s:
        r = run_http(w, HttpTarget("openai", s.base_url, "fake-model"), max_concurrency=1, warmup=0)
    recs = sorted(r.records, key=lambda x: x.arrival_time)
    for before, after in zip(recs, recs[1:]):
        assert after.scheduled_time >= before.finish_time  # due once the slot freed, after its holder finished
        assert after.scheduled_time <= after.arrival_time


def test_an_in_process_record_has_no_schedule_delay():
    rec = RequestRecord("0", 4, 2, 0.0, 0.0, 0.1, [0.1, 0.2], 0.2, 0, 0, "length")
    from cbbench.perf.client_lag import client_metrics

    assert all(math.isnan(v) for v in client_metrics([rec]).values())


def _row(delay_ms: float) -> dict[str, Any]:
    return {"engine": "openai", "batching": "", "median_schedule_delay_ms": delay_ms, "request_rate": 8.0}


def test_the_table_flags_a_lagging_client_and_only_that():
    entries = [(("openai", "-", "rate=8"), _row(25.0), None), (("openai", "-", "rate=4"), _row(0.5), None)]
    lines = [x for x in summary_lines(entries) if "client lagged" in x]
    assert len(lines) == 1 and "rate=8" in lines[0] and f"{CLIENT_LAG_MS:g} ms" in lines[0]


def test_the_gate_says_when_the_arms_clients_lagged_differently():
    calm, late = [_row(1.0)], [_row(30.0)]
    assert arms_lag_notes(["c"], [calm] * 3, [calm] * 3) == []
    assert arms_lag_notes(["c"], [late] * 3, [late] * 3) == []  # lagged alike: the comparison stands
    (note,) = arms_lag_notes(["c"], [calm] * 3, [calm, late, late])
    assert "lagged differently" in note and "0 of 3 base" in note and "2 of 3 head" in note


def test_the_gate_verdict_carries_the_lag_note(tmp_path):
    from cbbench.perf.gate.arms import Run
    from cbbench.perf.gate.run import GateOptions, _summary

    o = GateOptions(base_url="http://127.0.0.1:1", head_url="http://127.0.0.1:2", cwd=tmp_path)
    runs = [
        Run(arm, i, tmp_path / "r.csv", [_row(d)], 1.0, 1.0)
        for arm, d in (("base", 1.0), ("head", 30.0))
        for i in range(2)
    ]
    summary = _summary(o, [], 0.05, {"base": "a", "head": "b"}, runs, [], tmp_path / "g.csv", 1.0)
    assert any("lagged differently" in n for n in summary["notes"])


def _rec(i: int, sent: float, n_tokens: int, every: float) -> RequestRecord:
    times = [sent + every * (k + 1) for k in range(n_tokens)]
    return RequestRecord(str(i), 4, n_tokens, sent, None, times[0], times, times[-1], 0, 0, "length")


def test_steady_state_window_leaves_out_the_drain():
    """Four requests sent at 0 finish at 1, 2, 3 and 4 s, a token every 0.1 s each: four in flight until 1 s (the
    window: 0.95 x 4), then the drain. In the window 40 tokens in 1 s; over the whole run 100 tokens in 4 s."""
    recs = [_rec(i, 0.0, 10 * (i + 1), 0.1) for i in range(4)]
    m = steady_metrics(recs)
    assert m[NOTE_COLUMN] == ""
    assert m["steady_state_duration"] == 1.0
    assert math.isclose(float(m["steady_output_throughput"]), 40.0)
    assert math.isclose(float(m["steady_median_itl_ms"]), 100.0)
    assert math.isclose(float(m["steady_median_ttft_ms"]), 100.0)
    assert math.isclose(float(m["steady_median_tpot_ms"]), 100.0)  # the one request wholly inside


def test_steady_state_spreads_a_chunk_over_its_tokens_and_starts_at_full_load():
    """Chunked records (HTTP): each chunk of 3 tokens counts 3. Sent at 0, 0.5, 1.0, 1.5 under a cap of two, each
    1 s long: two in flight from 0.5 to 2.0 (each finish hands its slot to a send at the same instant), so the
    ramp-up's first 0.5 s and the drain's last are left out."""

    def chunked(i: int, sent: float) -> RequestRecord:
        chunks = [sent + 0.25 * (k + 1) for k in range(4)]
        return RequestRecord(
            str(i), 4, 12, sent, None, chunks[0], None, chunks[-1], None, None, "length", chunk_times=chunks
        )

    recs = [chunked(0, 0.0), chunked(1, 0.5), chunked(2, 1.0), chunked(3, 1.5)]
    m = steady_metrics(recs)
    assert m[NOTE_COLUMN] == "" and m["steady_state_duration"] == 1.5
    # chunks inside [0.5, 2.0]: 3 of request 0's, 4 of 1's, 4 of 2's, 2 of 3's: 13 chunks x 3 tokens
    assert math.isclose(float(m["steady_output_throughput"]), 13 * 3 / 1.5)


def test_no_usable_steady_state_is_a_reason_in_the_row_not_a_failure():
    one_at_a_time = [_rec(i, 2.0 * i, 5, 0.1) for i in range(3)]
    m = steady_metrics(one_at_a_time)
    assert "never two requests in flight" in str(m[NOTE_COLUMN]) and math.isnan(float(m["steady_output_throughput"]))
    failed = RequestRecord("0", 4, 0, 0.0, None, None, None, None, None, None, "error")
    assert "no request completed" in str(steady_metrics([failed])[NOTE_COLUMN])
    entries = [(("refengine", "continuous", "-"), {**m, "engine": "refengine"}, None)]
    assert any("never two requests" in x for x in summary_lines(entries, steady_state=True))
    assert not any("never two requests" in x for x in summary_lines(entries))


def test_perf_and_show_write_and_print_the_steady_state_and_client_figures(tmp_path):
    with FakeOpenAIServer(token_delay_s=0.005, with_metrics=False) as s:
        res = CliRunner().invoke(
            app,
            [
                "perf",
                "--workload",
                "fixed",
                "--workload-param",
                "input_len=8,output_len=6",
                "--num-prompts",
                "8",
                "--warmup",
                "0",
                "--quiet",
                "--backend",
                "openai",
                "--base-url",
                s.base_url,
                "--model",
                "fake-model",
                "--max-concurrency",
                "4",
                "--result-dir",
                str(tmp_path),
                "--steady-state",
                "--format",
                "markdown",
            ],
        )
    assert res.exit_code == 0, res.output
    assert "steady out tok/s" in res.output
    (csv,) = tmp_path.glob("*.csv")
    from cbbench.perf.results.rows import read_rows

    (row,) = read_rows(csv)
    assert row["median_schedule_delay_ms"] >= 0 and row["achieved_request_rate"] > 0
    assert row["steady_output_throughput"] > 0 and row["steady_state_duration"] > 0
    assert isinstance(row[NOTE_COLUMN], float) and math.isnan(row[NOTE_COLUMN])  # an empty cell: a window was found
    plain = CliRunner().invoke(app, ["show", str(csv), "--format", "markdown"])
    steady = CliRunner().invoke(app, ["show", str(csv), "--format", "markdown", "--steady-state"])
    assert plain.exit_code == steady.exit_code == 0, steady.output
    assert "steady out tok/s" not in plain.output and "steady out tok/s" in steady.output
    assert [c.header for c in table_columns([(("openai", "-", "-"), row, None)], steady_state=True)].count(
        "steady TTFT p50 ms"
    ) == 1


def _margin(runs: int) -> None:
    """`python perf/tests/test_client_clock.py [RUNS]`: the clock test's measurement RUNS times, to size the bounds'
    margin on this machine (docs/perf.md)."""
    import os

    for i in range(runs):
        w = _workload(CLOCK_REQUESTS, CLOCK_OUTPUT_LEN)
        with FakeOpenAIServer(token_delay_s=CLOCK_DELAY_S, with_metrics=False) as s:
            r = run_http(w, HttpTarget("openai", s.base_url, "fake-model"), max_concurrency=1, warmup=1)
        ttft, itl = clock_errors(r.records, CLOCK_DELAY_S)
        print(
            f"run {i}: load {os.getloadavg()[0]:.1f}, median TTFT error {ttft * 1e3:.2f} ms "
            f"(bound {TTFT_ERROR_BOUND_S * 1e3:g}), median ITL error {itl * 1e3:.2f} ms (bound {ITL_ERROR_BOUND_S * 1e3:g})",
            flush=True,
        )


if __name__ == "__main__":
    import sys

    _margin(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
