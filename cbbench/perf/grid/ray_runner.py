"""`--executor ray[:ADDRESS]`: each run of the plan is one Ray task on the cluster `ray.init(address=ADDRESS)` reaches.

The job goes into the object store once (`ray.put`); each task runs one index of it (`worker.run_one`) and returns
its `Outcome`, which is yielded as soon as `ray.wait` sees it. A simulated run asks for one CPU, a CUDA run for one
GPU (Ray then sets CUDA_VISIBLE_DEVICES, so each run has a GPU of its own). A task whose worker process dies is
retried by Ray itself (`max_retries`, the pool's `MAX_RETRIES`); once out of retries the run ends as an error naming
Ray's reason and the grid goes on. The cluster's nodes must have cbbench installed (the tasks import `perf`).

`ray.init` is called only when Ray is not initialised yet in this process, and a cluster this module started is
shut down at the end; one the caller had set up (a test's `ray.init(num_cpus=2)`) is left running.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cbbench.perf.grid.grid_worker import GridJob, Outcome, lost_run, run_one
from cbbench.perf.grid.pool import MAX_RETRIES
from cbbench.perf.plan.executor import RAY_MISSING


def _task(job: GridJob, index: int) -> Outcome:
    """One run, in a Ray worker (the object ref of the job is resolved by Ray before the call)."""
    return run_one(job, index)


@dataclass
class RayRunner:
    """The runs of `job` as Ray tasks; `gpu`: each asks for a GPU (a CUDA plan) rather than a CPU."""

    job: GridJob
    address: str | None = None
    gpu: bool = False
    max_retries: int = MAX_RETRIES
    events: list[str] = field(default_factory=list)

    def run(self, indices: Sequence[int]) -> Iterator[Outcome]:
        try:
            import ray
        except ImportError:
            raise ValueError(RAY_MISSING) from None
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.address, log_to_driver=False)
        try:
            yield from self._run(ray, indices)
        finally:
            if started:
                ray.shutdown()

    def _run(self, ray: Any, indices: Sequence[int]) -> Iterator[Outcome]:
        if self.gpu and ray.cluster_resources().get("GPU", 0) < 1:
            raise ValueError("executor: the Ray cluster has no GPU for the CUDA runs of this plan")
        resources = {"num_gpus": 1, "num_cpus": 1} if self.gpu else {"num_cpus": 1}
        task = ray.remote(max_retries=self.max_retries, retry_exceptions=False, **resources)(_task)
        job_ref = ray.put(self.job)
        pending = {task.remote(job_ref, i): i for i in indices}
        try:
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                index = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except ray.exceptions.RayError as e:  # the task's worker died on every attempt (not the run's own
                    spec = self.job.specs[index]  # exception: run_one returns that)
                    why = f"its Ray worker died on all {1 + self.max_retries} attempts ({_first_line(e)})"
                    self.events.append(f"{spec.describe()}: {why}; given up")
                    yield Outcome(index, lost_run(spec, why), 0.0, attempts=1 + self.max_retries)
        finally:
            for ref in pending:  # an interrupt: the runs not over are cancelled
                ray.cancel(ref, force=True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]
