"""Batching modes: one small object per `BatchingMode`, deciding who may be scheduled together.

Each object owns its mode's rules (docs/scheduling.md): the order of the scheduler's two passes in a step (the
running requests, then the waiting ones), how many requests may run at once, whether admission reserves blocks for
the whole length (prompt + max_tokens, so nothing is ever preempted) and, for static batching, which batch each
request belongs to (a batch holds its slots until the whole batch has left). The passes themselves are the
scheduler's (`Scheduler._schedule_running` / `_schedule_waiting`, what `SchedulingPasses` names);
`Scheduler.schedule()` just calls `mode.step`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from refengine.config import BatchingMode, SchedulerConfig

if TYPE_CHECKING:
    from refengine.request import Request
    from refengine.scheduler.scheduler_output import SchedulerOutput


class SchedulingPasses(Protocol):
    """What a mode drives: the scheduler's two passes over its running and waiting requests (refengine/scheduler/scheduler.py)."""

    @property
    def running(self) -> list[Request]: ...
    def _in_prefill(self, req: Request) -> bool: ...
    def _schedule_running(self, out: SchedulerOutput, prefill_only: bool = False) -> None: ...
    def _schedule_waiting(self, out: SchedulerOutput, admit_without_budget: bool = False) -> None: ...


class ContinuousBatching:
    """Iteration-level: running requests first, then, only if nobody was preempted, waiting ones join."""

    mode = BatchingMode.CONTINUOUS
    reserves_full_length = False  # blocks are allocated as tokens are computed; running out preempts

    def __init__(self, config: SchedulerConfig) -> None:
        self.max_num_seqs = config.max_num_seqs

    def step(self, sched: SchedulingPasses, out: SchedulerOutput) -> None:
        sched._schedule_running(out)
        if not out.preempted_req_ids:
            sched._schedule_waiting(out)

    def on_admit(self, request_id: str) -> None:
        """A waiting request has joined the running set (static batching notes its batch)."""

    def batch_ids(self, scheduled: list[str], running: list[str]) -> dict[str, int | None]:
        """The batch of each scheduled or running request: none here (a finished request frees its slot at once)."""
        ids: dict[str, int | None] = dict.fromkeys(scheduled)
        ids.update(dict.fromkeys(running))
        return ids

    @property
    def batch_id(self) -> int | None:
        return None


class SequenceBatching(ContinuousBatching):
    """TGI-like: newly admitted requests prefill in a step of their own; a step is all prefill or all decode."""

    mode = BatchingMode.SEQUENCE
    reserves_full_length = True

    def step(self, sched: SchedulingPasses, out: SchedulerOutput) -> None:
        if any(sched._in_prefill(r) for r in sched.running):
            sched._schedule_running(out, prefill_only=True)
            sched._schedule_waiting(out)
            return
        sched._schedule_waiting(out)
        if not out.num_scheduled_tokens:
            sched._schedule_running(out)


class StaticBatching(ContinuousBatching):
    """A batch forms only once the previous one has wholly left; its members keep their slots until then.

    `batch_of` remembers the batch of every member of the current and the previous batch: with async scheduling a
    step of the previous batch may be reported after the next batch has formed."""

    mode = BatchingMode.STATIC
    reserves_full_length = True

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self._batch_id = 0  # the batch now running (1, 2, ...)
        self.batch_of: dict[str, int] = {}

    def step(self, sched: SchedulingPasses, out: SchedulerOutput) -> None:
        if sched.running:
            sched._schedule_running(out)
            return
        self._batch_id += 1
        self.batch_of = {rid: b for rid, b in self.batch_of.items() if b == self._batch_id - 1}
        sched._schedule_waiting(out, admit_without_budget=True)  # a member that does not fit prefills later

    def on_admit(self, request_id: str) -> None:
        self.batch_of[request_id] = self._batch_id

    def batch_ids(self, scheduled: list[str], running: list[str]) -> dict[str, int | None]:
        batch_of = self.batch_of
        return {rid: batch_of.get(rid) for rid in (*scheduled, *running)}

    @property
    def batch_id(self) -> int | None:
        return self._batch_id


class NoBatching(StaticBatching):
    """One request at a time: a static batch of one (its stats report no batch, as continuous mode's)."""

    mode = BatchingMode.NONE

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.max_num_seqs = 1

    def batch_ids(self, scheduled: list[str], running: list[str]) -> dict[str, int | None]:
        return ContinuousBatching.batch_ids(self, scheduled, running)


_MODES: dict[BatchingMode, type[ContinuousBatching]] = {
    m.mode: m for m in (ContinuousBatching, SequenceBatching, StaticBatching, NoBatching)
}


def make_batching(config: SchedulerConfig) -> ContinuousBatching:
    return _MODES[BatchingMode(config.batching)](config)
