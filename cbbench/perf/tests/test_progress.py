"""`cbbench perf`'s progress: run labels that read as `refengine continuous, repeat 1/2` (with the load point in a
sweep), a live line per run in a terminal, and plain lines plus a heartbeat when stdout is not a TTY. Elapsed time
counts from the measured run's start (`advance(0)`, after engine build and warm-up); the tok/s so far is on the
records' clock (simulated seconds on a simulated GPU), so that it ends at the final table's figure."""

from __future__ import annotations

import io
import math
import re
import time

from rich.console import Console
from typer.testing import CliRunner

from cbbench.perf.backends.http_client import error_record
from cbbench.perf.cli import app
from cbbench.perf.knobs import EngineKnobs
from cbbench.perf.records import RequestRecord
from cbbench.perf.report.progress import RunProgress
from refengine.tests.waiting import wait_for

TINY = [
    "--workload",
    "fixed",
    "--workload-param",
    "input_len=8,output_len=4",
    "--num-prompts",
    "3",
    "--warmup",
    "1",
    "--cpu-threads",
    "0",
    "--peers",
    "none",
    "--batching",
    "continuous",
]
BEAT_S = 0.05  # the test's heartbeat: short, so the waits for beats below are short
RUN_S = 0.4  # how long the fake run lasts where no beats are awaited (a terminal draws no heartbeat)
ROW = {"output_throughput": 812.4, "median_ttft_ms": 12.34}


def test_dry_run_labels_name_repeat_of_total_and_the_load_point(tmp_path):
    res = CliRunner().invoke(
        app, ["perf", *TINY, "--repeats", "2", "--request-rate", "2,4", "--dry-run", "--result-dir", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    runs = res.stdout.strip().splitlines()[1:]
    assert runs == [
        "  refengine continuous, rate=2, repeat 1/2",
        "  refengine continuous, rate=4, repeat 1/2",
        "  refengine continuous, rate=4, repeat 2/2",  # (interleaved: the second repeat runs backward)
        "  refengine continuous, rate=2, repeat 2/2",
    ]
    assert not any(" - " in line or "(repeat" in line for line in runs)


def _fake_run(progress: RunProgress, label: str, n: int, log: io.StringIO | None = None) -> None:
    """A run of n requests. With `log`, each request waits for a new heartbeat line in it, not a time: the order of
    events (a beat while the run goes on) whatever the load; a heartbeat that never comes fails at the hang guard."""
    progress.start(label, n)
    progress.advance(0)  # the measured run starts
    for _ in range(n):
        if log is None:
            time.sleep(RUN_S / n)
        else:
            seen = log.getvalue().count(f"] {label}: ")
            wait_for(
                lambda seen=seen: log.getvalue().count(f"] {label}: ") > seen, "a heartbeat line while the run goes on"
            )
        progress.advance(1)
    progress.finish(ROW)


def test_not_a_tty_prints_a_line_per_run_and_a_heartbeat():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with RunProgress(console, 2, heartbeat_s=BEAT_S) as progress:
        _fake_run(progress, "refengine continuous, repeat 1/2", 4, log=out)
        progress.start("refengine continuous, repeat 2/2", 4)
        progress.finish(None, error="server unreachable")
    lines = out.getvalue().splitlines()
    # (a beat between start and advance(0), on a busy machine, is the warm-up line: legitimate, not counted)
    beats = [x for x in lines if x.startswith("... [1/2] refengine continuous, repeat 1/2: ") and "warming" not in x]
    assert len(beats) >= 4, lines  # one awaited per request
    assert all(re.search(r": \d/4 requests, \d+ s elapsed", x) for x in beats), beats
    assert re.fullmatch(
        r"\[1/2\] refengine continuous, repeat 1/2: 4/4 requests in \d+\.\d s, "
        r"812 tok/s, TTFT p50 12\.3 ms \| 1/2 runs, .*ETA .*",
        lines[-2],
    ), lines
    assert lines[-1].startswith("[2/2] refengine continuous, repeat 2/2: 0/4 requests in ")
    assert "failed: server unreachable | 2/2 runs" in lines[-1]
    assert "\x1b[" not in out.getvalue()  # no redraws or colours in a log


def test_terminal_draws_a_live_line_with_eta_and_the_last_runs_rates():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with RunProgress(console, 2, heartbeat_s=BEAT_S) as progress:
        _fake_run(progress, "refengine continuous, repeat 1/2", 4)
        _fake_run(progress, "refengine continuous, repeat 2/2", 4)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "[1/2] refengine continuous, repeat 1/2" in text and "[2/2] refengine continuous, repeat 2/2" in text
    assert "4/4" in text and "ETA" in text and "812 tok/s, TTFT p50 12.3 ms" in text
    assert "... [" not in text  # the heartbeat is for logs only


def test_quiet_prints_nothing():
    out = io.StringIO()
    with RunProgress(Console(file=out, force_terminal=False), 1, quiet=True, heartbeat_s=BEAT_S) as progress:
        _fake_run(progress, "refengine continuous, repeat 1/1", 2)
    assert out.getvalue() == ""


def test_perf_in_a_log_prints_each_finished_run(tmp_path, monkeypatch):
    monkeypatch.setenv("CBBENCH_HEARTBEAT_S", "0.05")
    res = CliRunner().invoke(app, ["perf", *TINY, "--repeats", "2", "--result-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    done = [x for x in res.stdout.splitlines() if x.startswith("[")]
    assert len(done) == 2, res.stdout
    assert done[0].startswith("[1/2] refengine continuous, repeat 1/2: 3/3 requests in ")
    assert done[1].startswith("[2/2] refengine continuous, repeat 2/2: 3/3 requests in ")
    assert all(re.search(r"\d+ tok/s, TTFT p50 \d+\.\d ms \| \d/2 runs, ", x) for x in done), done


class Clock:
    """A clock the test moves by hand, so that the numbers so far are exact."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _records(n: int, ttft_s: float, output_len: int, finish: float = 2.0) -> list[RequestRecord]:
    """n requests that arrive at 1.0 and finish at `finish` on the run's own clock (the engine's)."""
    return [
        RequestRecord(str(i), 8, output_len, 1.0, 1.0, 1.0 + ttft_s, None, finish, 0, 0, "length") for i in range(n)
    ]


def test_terminal_line_shows_the_runs_tok_s_and_ttft_p50_so_far():
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=True, width=200)
    with RunProgress(console, 1, heartbeat_s=BEAT_S, clock=clock) as progress:
        progress.start("refengine continuous, repeat 1/1", 10)
        progress.advance(0)
        clock.t += 2.0
        # 3 requests of 10 tokens over 2 s of the records' clock (1.0 -> 3.0): 15 tok/s, TTFTs of 5 ms; the failed
        # one counts for neither
        progress.advance(4, _records(3, 0.005, 10, finish=3.0) + [error_record("9", 8, 10, 2.0, "boom")])
        progress.advance(1, _records(1, 0.005, 10))  # within SUMMARY_EVERY_S: the line keeps the numbers it has
        progress._bar.refresh()
        live = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
        assert "5/10" in live and "ETA" in live and "15 tok/s, TTFT p50 5.0 ms so far" in live, live
        clock.t += 1.0
        progress.advance(1, _records(1, 0.020, 10, finish=3.5))  # 50 tokens over 1.0 -> 3.5: 20 tok/s
        progress._bar.refresh()
        live = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
        assert "6/10" in live and "20 tok/s, TTFT p50 5.0 ms so far" in live, live
        progress.finish(ROW)
    assert "812 tok/s, TTFT p50 12.3 ms" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())


def test_heartbeat_shows_the_numbers_so_far():
    out = io.StringIO()
    with RunProgress(Console(file=out, force_terminal=False, width=200), 1, heartbeat_s=BEAT_S) as progress:
        progress.start("refengine continuous, repeat 1/1", 4)
        progress.advance(0)
        progress.advance(2, _records(2, 0.010, 5))
        time.sleep(RUN_S)
        progress.finish(ROW)
    beats = [x for x in out.getvalue().splitlines() if x.startswith("... [1/1]")]
    assert beats and all(re.search(r"2/4 requests, .* tok/s, TTFT p50 10\.0 ms so far$", x) for x in beats), beats


BUILD_S, MEASURED_S = 20.0, 5.0  # engine build + warm-up, then the measured run (issue 28: 25.5 s vs 11.95 s)


def test_elapsed_counts_from_the_measured_start_in_a_log_and_on_a_terminal():
    out, clock = io.StringIO(), Clock()
    with RunProgress(Console(file=out, force_terminal=False, width=200), 1, heartbeat_s=60, clock=clock) as progress:
        progress.start("refengine continuous, repeat 1/1", 2)
        clock.t += BUILD_S
        progress.advance(0)
        clock.t += MEASURED_S
        progress.advance(2, _records(2, 0.01, 4))
        progress.finish(ROW)
    assert ": 2/2 requests in 5.0 s, 812 tok/s" in out.getvalue(), out.getvalue()
    out, clock = io.StringIO(), Clock()
    with RunProgress(Console(file=out, force_terminal=True, width=200), 1, heartbeat_s=60, clock=clock) as progress:
        progress.start("refengine continuous, repeat 1/1", 2)
        clock.t += BUILD_S
        progress.advance(0)
        clock.t += MEASURED_S
        progress.advance(1, _records(1, 0.01, 4))
        progress._bar.refresh()
    live = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "0:00:05" in live and "0:00:25" not in live, live  # the bar's clock is the progress clock


def test_heartbeat_before_the_measured_start_says_the_engine_is_being_built():
    out = io.StringIO()
    with RunProgress(Console(file=out, force_terminal=False, width=200), 1, heartbeat_s=BEAT_S) as progress:
        progress.start("refengine continuous, repeat 1/1", 4)
        time.sleep(RUN_S)
        progress.finish(None, error="boom")
    beats = [x for x in out.getvalue().splitlines() if x.startswith("... [1/1]")]
    assert beats and all("building and warming up the engine" in x for x in beats), beats


def test_tok_s_so_far_is_on_the_records_clock_not_the_wall():
    """A simulated GPU: 8 s of wall time for a run whose records span 0.5 simulated seconds."""
    out, clock = io.StringIO(), Clock()
    with RunProgress(Console(file=out, force_terminal=True, width=200), 1, heartbeat_s=60, clock=clock) as progress:
        progress.start("refengine continuous, repeat 1/1", 4)
        progress.advance(0)
        clock.t += 8.0
        progress.advance(4, _records(4, 0.01, 100, finish=1.5))  # 400 tokens, arrivals 1.0, finishes 1.5
        progress._bar.refresh()
    live = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "800 tok/s" in live and "50 tok/s" not in live, live


REL_TOL = 1e-9  # the same sum over the same span, in another order: float rounding only


def test_a_simulated_run_marks_its_start_and_its_live_rate_ends_at_the_tables():
    from cbbench.perf.backends.in_process import run_refengine
    from cbbench.perf.report.progress import SoFar
    from cbbench.workloads.catalog import get_workload

    calls: list[tuple[int, list[RequestRecord]]] = []
    w = get_workload("fixed", tokenizer=None, num_prompts=8, seed=0, input_len=64, output_len=16)
    args = EngineKnobs().engine_args(model="llama-3.1-8b", device="sim:h200", dtype=None, seed=0, batching="continuous")
    r = run_refengine(
        w, engine_args=args, knobs=EngineKnobs(), warmup=1, progress=lambda n, recs=(): calls.append((n, list(recs)))
    )
    assert calls[0] == (0, []) and all(n > 0 for n, _ in calls[1:])  # the start mark, once, before any finish
    so_far = SoFar()
    for _, recs in calls:
        so_far.add(recs)
    table = r.metrics(metric_percentiles=[50], goodput=None)["output_throughput"]
    assert math.isclose(so_far.output_throughput(), table, rel_tol=REL_TOL), (so_far.output_throughput(), table)
