"""The runs of a plan through the chosen executor, as `Outcome`s in finishing order, and their progress lines.

`outcomes` is the one loop sweep.py iterates, whatever the executor: serially it runs each spec here, with the live
per-request progress of report/progress.py; a pool or Ray yields each run when a worker is done with it, and
`GridProgress` prints one line per finished run (a worker's requests cannot be followed from here) with the grid's
count, rate and ETA, under a live bar in a terminal, with a heartbeat in a log.
`Grid.notes` are the lines printed under the table: where the runs ran, and any worker that died on the way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from cbbench.perf.grid.grid_worker import Outcome, make_job
from cbbench.perf.grid.pool import ProcessPool
from cbbench.perf.grid.ray_runner import RayRunner
from cbbench.perf.plan.executor import ExecutorChoice, pool_size
from cbbench.perf.report.progress import GridEta, RunProgress, heartbeat_interval, run_summary

if TYPE_CHECKING:
    from cbbench.perf.grid.build import RunPlan


@dataclass
class Grid:
    """The runs `todo` (indices into `plan.specs`) on `choice`."""

    plan: RunPlan
    choice: ExecutorChoice
    todo: Sequence[int]
    events: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    runner: ProcessPool | RayRunner | None = None  # a parallel grid's (its `events` become notes)

    def progress(self, console: Console) -> RunProgress | GridProgress:
        if self.choice.kind == "serial":
            return RunProgress(console, len(self.todo), quiet=self.plan.quiet)
        return GridProgress(console, len(self.todo), self.choice.describe(len(self.todo)), quiet=self.plan.quiet)

    def outcomes(self, progress: RunProgress | GridProgress) -> Generator[Outcome, None, None]:
        """Each run's outcome as it ends. A parallel run's progress line is started here, its numbers filled in by
        the caller's `progress.finish(row, error)` once the row is made."""
        start = time.perf_counter()
        try:
            if isinstance(progress, RunProgress):  # a serial grid's
                yield from self._serial(progress)
                return
            for out in self._parallel():
                spec = self.plan.specs[out.index]
                progress.start(spec.describe(), len(spec.workload), out.wall_s, out.attempts)
                yield out
        finally:
            self.elapsed_s = time.perf_counter() - start
            if self.runner is not None:
                self.events += self.runner.events

    def _serial(self, progress: RunProgress) -> Iterator[Outcome]:
        from refengine.worker.worker import keep_preset_weights  # (brings in torch)

        with keep_preset_weights():  # one model's engines, one after another: its weights are drawn once
            yield from self._serial_runs(progress)

    def _serial_runs(self, progress: RunProgress) -> Iterator[Outcome]:
        for i in self.todo:
            spec = self.plan.specs[i]
            progress.start(spec.describe(), len(spec.workload))
            start = time.perf_counter()
            result = self.plan.backends[spec.backend].run(spec, progress.advance)
            yield Outcome(i, result, time.perf_counter() - start)

    def _parallel(self) -> Iterator[Outcome]:
        job = make_job(self.plan)
        if self.choice.kind == "pool":
            self.runner = ProcessPool(job, pool_size(self.choice, len(self.todo)))
        else:
            self.runner = RayRunner(job, address=self.choice.address, gpu=self.plan.settings.device.is_cuda)
        yield from self.runner.run(self.todo)

    @property
    def notes(self) -> list[str]:
        """What the table's notes say about the executor (nothing for a serial run that went as always)."""
        if self.choice.kind == "serial" or not self.todo:
            return list(self.events)
        line = f"{len(self.todo)} run(s) on {self.choice.describe(len(self.todo))} in {self.elapsed_s:.1f} s elapsed"
        return [line, *self.events]


class GridProgress:
    """The progress of a parallel grid: one line per finished run, in finishing order (`[3/8] refengine continuous,
    ...: 16 requests, 0.4 s on a worker, 1890 tok/s, TTFT p50 66.0 ms | 3/8 runs, 12.0 runs/min, ETA 25 s`). In a
    terminal a live bar below them counts the runs, with their rate and the ETA; in a log (not a TTY) a heartbeat
    line says the same every `heartbeat_s` while no run finishes (a worker's requests cannot be followed from here)."""

    def __init__(
        self,
        console: Console,
        num_runs: int,
        where: str,
        *,
        quiet: bool = False,
        live: bool | None = None,
        heartbeat_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.num_runs, self.where, self.quiet, self.clock = console, num_runs, where, quiet, clock
        self.live = console.is_terminal if live is None else live
        self.heartbeat_s = heartbeat_interval() if heartbeat_s is None else heartbeat_s
        self.index, self.line = 0, ""
        self.grid = GridEta(num_runs, clock)
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> GridProgress:
        self.grid = GridEta(self.num_runs, self.clock)
        if self.quiet or not self.num_runs:
            return self
        self._print(f"running {self.num_runs} run(s) on {self.where}")
        if self.live:
            self._bar = Progress(
                TextColumn("runs"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[eta]}"),
                console=self.console,
                transient=True,
                get_time=self.clock,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("runs", total=self.num_runs, eta="")
        else:
            self._thread = threading.Thread(target=self._beat, name="cbbench-grid-heartbeat", daemon=True)
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

    def start(self, label: str, total: int, wall_s: float = 0.0, attempts: int = 1) -> None:
        self.index += 1
        tried = f", attempt {attempts}" if attempts > 1 else ""
        self.line = f"[{self.index}/{self.num_runs}] {label}: {total} requests, {wall_s:.1f} s on a worker{tried}"

    def finish(self, row: Mapping[str, object] | None, error: str | None = None) -> None:
        summary = f"failed: {error}" if error else run_summary(row)
        with self._lock:
            self.grid.done += 1
            grid = self.grid.text()
        if self.quiet:
            return
        self._print(self.line + (f", {summary}" if summary else "") + f" | {grid}")
        if self._bar is not None and self._task is not None:  # (the bar's one task, added with it)
            self._bar.update(self._task, completed=self.grid.done, eta=grid.partition(" runs, ")[2])

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                line = f"... {self.grid.text()} on {self.where}"
            self._print(line)

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
