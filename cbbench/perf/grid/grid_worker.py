"""What a grid worker is given and what it sends back: the plan's specs and backends (`GridJob`, sent once per
worker), one run by its index in the plan (`run_one`), its `Outcome`.

A worker imports only what unpickling the job needs: the plan's types and the modules of the backends that run its
specs (for a simulated plan: refengine and the in-process backend), never the report, pandas or the HTTP client. The
row is made in the parent from the returned `RunResult`, exactly as a serial run makes it, so that every executor
writes the same rows.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cbbench.perf.backends.backend import RunResult

if TYPE_CHECKING:
    from cbbench.perf.backends.backend import Backend
    from cbbench.perf.grid.build import RunPlan
    from cbbench.perf.plan.spec import RunSpec


@dataclass
class GridJob:
    """The part of a plan a worker needs: every spec (a run is named by its index) and the backends that run them."""

    specs: list[RunSpec]
    backends: dict[str, Backend]

    @property
    def modules(self) -> list[str]:
        """The modules a worker imports to run this job (what a pool's fork server loads once, up front): the
        backends' own, and refengine's engine for the in-process ones (engine, peer: both drive refengine or its
        weights); `import refengine` is lazy, and its engine module imports torch, the largest part of a fresh worker's
        start (docs/measurements.md)."""
        mods = {__name__, *(type(b).__module__ for b in self.backends.values())}
        if any(b.kind in ("engine", "peer") for b in self.backends.values()):
            mods.add("refengine.engine.llm_engine")
        return sorted(mods)


@dataclass
class Outcome:
    """One run's end in a worker: its result, or the exception its backend raised (re-raised by the parent, as a
    serial run would raise it); `wall_s` is the worker's wall time for the run, `attempts` how many it took."""

    index: int
    result: RunResult | None
    wall_s: float
    exception: BaseException | None = None
    pid: int = 0
    attempts: int = 1


def make_job(plan: RunPlan) -> GridJob:
    """`plan`'s job, without the workloads' tokenizer (the in-process backends load their model's own; it is the
    largest object of the settings)."""
    backends = {}
    for name, backend in plan.backends.items():
        b = copy.copy(backend)
        b.settings = dataclasses.replace(backend.settings, tokenizer=None)
        backends[name] = b
    return GridJob(list(plan.specs), backends)


def run_one(job: GridJob, index: int) -> Outcome:
    """Run spec `index` of `job` here; an exception is returned, not raised (a worker serves the next run)."""
    spec = job.specs[index]
    start = time.perf_counter()
    try:
        result = job.backends[spec.backend].run(spec)
    except Exception as e:  # noqa: BLE001 - the parent re-raises it where a serial run would have
        return Outcome(index, None, time.perf_counter() - start, exception=_portable(e), pid=os.getpid())
    return Outcome(index, result, time.perf_counter() - start, pid=os.getpid())


def lost_run(spec: RunSpec, why: str) -> RunResult:
    """The result of a run whose worker died on every attempt: an error, as a run that could not run reports."""
    return RunResult(spec.backend, spec.batching, spec.knobs, error=why)


def _portable(e: BaseException) -> BaseException:
    """`e` if it survives pickling (a ValueError naming a knob stays a ValueError), else its text in a RuntimeError."""
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001 - any exception type may refuse pickling in its own way
        return RuntimeError(f"{type(e).__name__}: {e}")
    return e
