"""`cbbench perf`'s and `cbbench plan`'s progress: a live line per run in a terminal, plain lines in a log, and over
the whole grid the runs done / total, their rate and an ETA (`GridEta`), on every executor.

In a terminal (the console is a TTY) one rich line per run shows requests done / total, elapsed, ETA, and the run's
output tok/s and TTFT p50 so far (from the records the backend hands to `advance`), its final ones once it is over.
When stdout is not a TTY (a CI log) nothing is redrawn: one plain line per finished run, and a heartbeat line every
`heartbeat_s` seconds while a run is going (with the same numbers so far), so a long sweep is never silent.
`CBBENCH_HEARTBEAT_S` overrides the heartbeat interval. Each finished run's line (and the terminal's bar) also
carries the grid's count, rate and ETA: `3/8 runs, 1.5 runs/min, ETA 3 min 20 s`, the ETA being the mean time per
finished run so far times the runs left (runs finish in parallel on a pool, so it is wall time, not run time).

Time bases. Elapsed time and ETA are wall seconds of the measured run: they start when the backend says the
measured run starts (`advance(0)`, once the engine is built and warmed up), not when the run's line appears. The
tok/s so far is on the run's own clock, the one its records' times are in: output tokens over the span from the
earliest arrival to the latest finish among the finished requests. On a real device that is wall time; on a
simulated GPU it is simulated seconds, as the final table's `output_throughput` (tokens / (last finish - start)),
which it meets once every request has finished.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

if TYPE_CHECKING:
    from cbbench.perf.records import RequestRecord

HEARTBEAT_S = 30.0  # a CI log that stays silent longer than this reads as a hang
HEARTBEAT_ENV = "CBBENCH_HEARTBEAT_S"
SUMMARY_EVERY_S = 0.25  # the numbers so far are recomputed at most this often: a median per request would add up


def heartbeat_interval(default: float = HEARTBEAT_S) -> float:
    raw = os.environ.get(HEARTBEAT_ENV)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{HEARTBEAT_ENV}: expected seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"{HEARTBEAT_ENV}: must be > 0, got {raw!r}")
    return value


def duration(seconds: float) -> str:
    """`45 s`, `3 min 20 s`, `2 h 05 min`: an ETA as a person reads it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class GridEta:
    """The grid's runs done / total, their rate and the ETA, on `clock` from the moment the grid starts."""

    def __init__(self, num_runs: int, clock: Callable[[], float]) -> None:
        self.num_runs, self.clock, self.done = num_runs, clock, 0
        self.started = clock()

    def text(self) -> str:
        """`3/8 runs, 1.5 runs/min, ETA 3 min 20 s` (no rate or ETA before the first run is over)."""
        elapsed = self.clock() - self.started
        head = f"{self.done}/{self.num_runs} runs"
        if not self.done or elapsed <= 0:
            return head
        per_s = self.done / elapsed
        rate = f"{per_s:.2f} runs/s" if per_s >= 1 else f"{per_s * 60:.1f} runs/min"
        left = self.num_runs - self.done
        return f"{head}, {rate}" + (f", ETA {duration(left / per_s)}" if left else f", all in {duration(elapsed)}")


def run_summary(row: Mapping[str, object] | None) -> str:
    """`812 tok/s, TTFT p50 12.3 ms` from a finished run's CSV row ('' when it has none)."""
    if not row:
        return ""
    tps, ttft = row.get("output_throughput"), row.get("median_ttft_ms")
    parts = []
    if isinstance(tps, (int, float)) and math.isfinite(tps):
        parts.append(f"{tps:.0f} tok/s")
    if isinstance(ttft, (int, float)) and math.isfinite(ttft):
        parts.append(f"TTFT p50 {ttft:.1f} ms")
    return ", ".join(parts)


class SoFar:
    """A run's output tok/s and TTFT p50 so far, from the records of the requests that have finished."""

    def __init__(self) -> None:
        self.output_tokens, self.ttfts_s = 0, list[float]()
        self.first_arrival, self.last_finish = math.inf, -math.inf  # on the records' clock (see the docstring)

    def add(self, records: Sequence[RequestRecord]) -> None:
        for r in records:
            if r.error:
                continue
            self.output_tokens += r.output_len or 0
            self.first_arrival = min(self.first_arrival, r.arrival_time)
            if r.finish_time is not None:
                self.last_finish = max(self.last_finish, r.finish_time)
            if r.first_token_time is not None:
                self.ttfts_s.append(r.first_token_time - r.arrival_time)

    def output_throughput(self) -> float | None:
        """Output tokens per second of the run's own clock so far (None before a finished request has a span)."""
        span = self.last_finish - self.first_arrival
        return self.output_tokens / span if self.output_tokens and span > 0 else None

    def summary(self) -> str:
        """`812 tok/s, TTFT p50 12.3 ms so far`, as `run_summary` words a finished run ('' before any record)."""
        row = {
            "output_throughput": self.output_throughput(),
            "median_ttft_ms": statistics.median(self.ttfts_s) * 1000 if self.ttfts_s else None,
        }
        text = run_summary(row)
        return f"{text} so far" if text else ""


class RunProgress:
    """Progress of the runs of one plan. Use as a context manager; `start` a run, `advance` it, `finish` it."""

    def __init__(
        self,
        console: Console,
        num_runs: int,
        *,
        quiet: bool = False,
        live: bool | None = None,
        heartbeat_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.num_runs, self.quiet, self.clock = console, num_runs, quiet, clock
        self.live = console.is_terminal if live is None else live
        self.heartbeat_s = heartbeat_interval() if heartbeat_s is None else heartbeat_s
        self.index, self.label, self.done, self.total, self.started = 0, "", 0, 0, 0.0
        self.measuring = False  # the measured run has started (`advance(0)`, or a first finished request)
        self.so_far, self.shown_at = SoFar(), -math.inf  # this run's numbers so far, and when the line last had them
        self.grid = GridEta(num_runs, clock)
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> RunProgress:
        self.grid = GridEta(self.num_runs, self.clock)
        if self.quiet:
            return self
        if self.live:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[numbers]}"),
                console=self.console,
                transient=False,
                get_time=self.clock,  # elapsed and ETA on the same clock as the plain lines
            )
            self._bar.__enter__()
        else:
            self._thread = threading.Thread(target=self._beat, name="cbbench-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)

    def start(self, label: str, total_requests: int) -> None:
        """A run's line appears: its engine is being built and warmed up; its clock starts with `advance(0)`."""
        with self._lock:
            self.index += 1
            self.label, self.done, self.total, self.started = label, 0, total_requests, self.clock()
            self.so_far, self.shown_at, self.measuring = SoFar(), -math.inf, False
        if self._bar is not None:  # a line per run: the finished ones stay on screen; elapsed waits for advance(0)
            self._task = self._bar.add_task(
                f"[{self.index}/{self.num_runs}] {label}", total=total_requests, numbers="", start=False
            )

    def advance(self, n: int, records: Sequence[RequestRecord] = ()) -> None:
        """`n` more requests finished; `records`, when the backend has them, update the numbers so far.
        `advance(0)` with no records: the measured run starts now (elapsed and ETA count from here). A backend that
        never says so has its run timed from `start`, and its live line from its first finished request."""
        with self._lock:
            if not self.measuring:
                self.measuring = True
                if n == 0 and not records:
                    self.started = self.clock()
                if self._bar is not None and self._task is not None:
                    self._bar.start_task(self._task)
            self.done += n
            self.so_far.add(records)
            now = self.clock()
            numbers = None
            if self._bar is not None and now - self.shown_at >= SUMMARY_EVERY_S:
                numbers, self.shown_at = self.so_far.summary(), now
        if self._bar is not None and self._task is not None:
            if numbers is None:
                self._bar.update(self._task, advance=n)
            else:
                self._bar.update(self._task, advance=n, numbers=numbers)

    def finish(self, row: Mapping[str, object] | None, error: str | None = None) -> None:
        """The run is over: its line says how it went (the row's tok/s and TTFT p50, or the error)."""
        with self._lock:
            elapsed, label, self.label = self.clock() - self.started, self.label, ""
            self.grid.done += 1
        summary = f"failed: {error}" if error else run_summary(row)
        if self.quiet:
            return
        if self._bar is not None:
            grid = f" | {self.grid.text()}" if self.num_runs > 1 else ""
            if self._task is not None:  # (its line was added by `start`)
                self._bar.update(self._task, completed=self.total, numbers=summary + grid)
            return
        self._print(
            f"[{self.index}/{self.num_runs}] {label}: {self.done}/{self.total} requests in {elapsed:.1f} s"
            + (f", {summary}" if summary else "")
            + (f" | {self.grid.text()}" if self.num_runs > 1 else "")
        )

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                if not self.label:
                    continue
                elapsed = self.clock() - self.started
                head = f"... [{self.index}/{self.num_runs}] {self.label}: "
                if not self.measuring:
                    line = f"{head}building and warming up the engine, {elapsed:.0f} s"
                else:
                    eta = elapsed * (self.total - self.done) / self.done if self.done else math.nan
                    numbers = self.so_far.summary()
                    line = (
                        f"{head}{self.done}/{self.total} requests, {elapsed:.0f} s elapsed"
                        + (f", ETA {eta:.0f} s" if math.isfinite(eta) else "")
                        + (f", {numbers}" if numbers else "")
                    )
            self._print(line)

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
