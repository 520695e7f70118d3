"""Every long command's progress counts the grid's runs, their rate and an ETA: serial runs (a live line per run in
a terminal, plain lines in a log) and pool / Ray grids (a live bar in a terminal, plain lines and a heartbeat in a
log), all on an injected clock."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from cbbench.perf.grid.run import GridProgress
from cbbench.perf.report.progress import GridEta, RunProgress, duration

ROW = {"output_throughput": 812.4, "median_ttft_ms": 12.34}
RUN_S = 30.0  # each fake run takes 30 s of the fake clock: 2 runs/min
BEAT_TRIES = 3000  # 10 ms apart: the heartbeat (every 10 ms) has 30 s to show up on a loaded machine


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def console(terminal: bool) -> Console:
    return Console(file=io.StringIO(), force_terminal=terminal, width=250, color_system=None)


def test_eta_is_the_mean_time_per_finished_run_times_the_runs_left():
    clock = FakeClock()
    eta = GridEta(8, clock)
    assert eta.text() == "0/8 runs"
    clock.now += 90.0
    eta.done = 3
    assert eta.text() == "3/8 runs, 2.0 runs/min, ETA 2 min 30 s"
    clock.now += 60.0
    eta.done = 8
    assert eta.text() == "8/8 runs, 3.2 runs/min, all in 2 min 30 s"
    assert duration(7322) == "2 h 02 min" and duration(4.4) == "4 s"


def _grid(progress: GridProgress, clock: FakeClock, runs: int) -> None:
    with progress:
        for i in range(runs):
            clock.now += RUN_S
            progress.start(f"refengine continuous, max_num_seqs={i}", 16, RUN_S)
            progress.finish(ROW)


def test_a_pool_grid_in_a_log_prints_count_rate_and_eta_per_run():
    clock, out = FakeClock(), console(False)
    _grid(GridProgress(out, 4, "pool (2 worker processes)", clock=clock, heartbeat_s=3600), clock, 4)
    lines = out.file.getvalue().splitlines()
    assert lines[0] == "running 4 run(s) on pool (2 worker processes)"
    assert lines[2].endswith("812 tok/s, TTFT p50 12.3 ms | 2/4 runs, 2.0 runs/min, ETA 1 min 00 s")
    assert lines[4].endswith("| 4/4 runs, 2.0 runs/min, all in 2 min 00 s")
    assert "\x1b" not in out.file.getvalue()  # plain lines: no cursor movement in a CI log


def test_a_pool_grid_in_a_log_beats_while_no_run_finishes():
    clock, out = FakeClock(), console(False)
    beat = threading.Event()
    progress = GridProgress(out, 4, "ray", clock=clock, heartbeat_s=0.01)
    with progress:
        clock.now += RUN_S
        progress.start("a", 16, RUN_S)
        progress.finish(ROW)
        clock.now += RUN_S
        want = "... 1/4 runs, 1.0 runs/min, ETA 3 min 00 s on ray"
        for _ in range(BEAT_TRIES):  # a bounded wait for the heartbeat thread's line (no time is asserted)
            if want in out.file.getvalue():
                break
            beat.wait(0.01)
    assert want in out.file.getvalue(), out.file.getvalue()


def test_a_pool_grid_on_a_terminal_draws_a_bar_with_count_and_eta():
    clock, out = FakeClock(), console(True)
    progress = GridProgress(out, 4, "pool (2 worker processes)", clock=clock)
    assert progress.live
    _grid(progress, clock, 2)
    text = out.file.getvalue()
    assert "2/4" in text and "2.0 runs/min, ETA 1 min 00 s" in text


def test_serial_runs_carry_the_grids_count_and_eta_in_a_log_and_on_a_terminal():
    for terminal in (False, True):
        clock, out = FakeClock(), console(terminal)
        with RunProgress(out, 3, clock=clock, heartbeat_s=3600) as progress:
            for _ in range(2):
                progress.start("refengine continuous", 4)
                progress.advance(0)
                clock.now += RUN_S
                progress.advance(4)
                progress.finish(ROW)
        assert "2/3 runs, 2.0 runs/min, ETA 30 s" in out.file.getvalue(), terminal
