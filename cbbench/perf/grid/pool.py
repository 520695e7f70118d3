"""The local process pool of `--executor pool[:N]`: N worker processes, each holding one run at a time.

concurrent.futures' pool cannot say which run a dead worker held (every pending future fails with
BrokenProcessPool), so this pool keeps its own books: each worker has a pipe and a run, and `run` waits on the pipes
and on the processes' sentinels together. A result is yielded the moment it arrives; a worker that dies (killed,
out of memory) is replaced by a fresh process and its run is tried again, up to `MAX_RETRIES` times, after which
the run ends as an error naming how its worker died, and the grid goes on.

Workers start from a fork server that has already imported the job's modules (Unix), so a fresh worker, the first
or a replacement, costs a fork, not an interpreter start and torch's import; elsewhere they are spawned. A worker
ignores SIGINT: Ctrl-C reaches the parent, which stops the workers and keeps the finished runs.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from cbbench.perf.grid.grid_worker import GridJob, Outcome, lost_run, run_one

MAX_RETRIES = 2  # a run is tried at most 1 + MAX_RETRIES times (Ray's own default task retries are 3)
_STOP_TIMEOUT_S = 5.0  # a worker asked to stop gets this long to exit before it is terminated


def _worker_main(conn: Connection, job_bytes: bytes) -> None:
    """A worker: unpickle the job once, then run each index sent until told to stop (None) or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    job = pickle.loads(job_bytes)
    if "torch" in sys.modules:  # N workers on N cores: torch's own thread pool in each would oversubscribe them
        sys.modules["torch"].set_num_threads(1)
    while True:
        try:
            index = conn.recv()
        except (EOFError, OSError):
            return
        if index is None:
            return
        conn.send(run_one(job, index))


@dataclass
class _Slot:
    proc: Any  # a multiprocessing Process
    conn: Connection
    index: int | None = None  # the run it holds


@dataclass
class ProcessPool:
    """`workers` processes running the runs of `job`; `events` says what went wrong on the way (deaths, retries)."""

    job: GridJob
    workers: int
    max_retries: int = MAX_RETRIES
    events: list[str] = field(default_factory=list)
    _ctx: Any = None
    _blob: bytes = b""
    _todo: deque[int] = field(default_factory=deque)
    _tries: dict[int, int] = field(default_factory=dict)  # index -> attempts so far
    _started: list[_Slot] = field(default_factory=list)

    def run(self, indices: Sequence[int]) -> Iterator[Outcome]:
        """Every run of `indices`, as an `Outcome` the moment it is over (in finishing order)."""
        self._ctx, self._blob = _context(self.job), pickle.dumps(self.job)
        self._todo, self._tries, self._started = deque(indices), dict.fromkeys(indices, 0), []
        slots = [self._start() for _ in range(min(self.workers, len(self._todo)))]
        try:
            while any(s.index is not None for s in slots):
                ready = set(wait([s.conn for s in slots] + [s.proc.sentinel for s in slots]))
                alive: list[_Slot] = []
                for s in slots:  # (a dead worker's pipe may read EOF before its sentinel is ready)
                    out = self._receive(s) if s.conn in ready else None
                    if out is not None:
                        yield out
                        self._dispatch(s)
                        alive.append(s)
                    elif s.proc.sentinel in ready:  # dead: its run goes back to the queue, or is given up
                        given_up = self._bury(s)
                        if given_up is not None:
                            yield given_up
                        if self._todo:
                            alive.append(self._start())
                    else:
                        alive.append(s)
                slots = alive
        finally:
            _stop(self._started)  # every worker this run started: an interrupt may come between two of the above

    def _start(self) -> _Slot:
        """A fresh worker, given the next run at once."""
        ours, theirs = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(theirs, self._blob), daemon=True, name="cbbench-grid")
        proc.start()
        theirs.close()
        slot = _Slot(proc, ours)
        self._started.append(slot)
        self._dispatch(slot)
        return slot

    def _dispatch(self, s: _Slot) -> None:
        s.index = self._todo.popleft() if self._todo else None
        if s.index is not None:
            self._tries[s.index] += 1
            s.conn.send(s.index)

    def _receive(self, s: _Slot) -> Outcome | None:
        try:
            out: Outcome = s.conn.recv()
        except (EOFError, OSError):
            return None  # the worker died: its sentinel tells the rest
        s.index = None
        out.attempts = self._tries[out.index]
        return out

    def _bury(self, s: _Slot) -> Outcome | None:
        """A dead worker: its run is queued again (first in line), or, out of retries, ended as an error (returned)."""
        s.proc.join()
        s.conn.close()
        lost, s.index = s.index, None
        if lost is None:
            return None
        spec, how, tries = self.job.specs[lost], _how(s.proc.exitcode), self._tries[lost]
        if tries <= self.max_retries:
            self.events.append(
                f"{spec.describe()}: its worker (pid {s.proc.pid}) {how}; tried again "
                f"(attempt {tries + 1} of {1 + self.max_retries})"
            )
            self._todo.appendleft(lost)
            return None
        why = f"its worker died on all {tries} attempts (the last one {how})"
        self.events.append(f"{spec.describe()}: {why}; given up")
        return Outcome(lost, lost_run(spec, why), 0.0, attempts=tries)


def _how(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _context(job: GridJob) -> Any:
    """A fork server that has imported the job's modules where there is one (Unix), else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(job.modules)  # only read when the fork server starts (the first pool of a process)
    return ctx


def _stop(slots: list[_Slot]) -> None:
    """Ask every worker to stop, then terminate those still running (a run cut short by an interrupt)."""
    for s in slots:
        if s.proc.is_alive() and s.index is None:
            try:
                s.conn.send(None)
            except OSError:
                pass
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    for s in slots:
        if s.index is not None:
            s.proc.terminate()
        s.proc.join(max(0.0, deadline - time.monotonic()))
        if s.proc.is_alive():
            s.proc.kill()
            s.proc.join()
        s.conn.close()
