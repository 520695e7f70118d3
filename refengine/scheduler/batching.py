"""Batching modes: one small policy object per `BatchingMode`, deciding who may be scheduled together.

Each object owns its mode's rules (docs/scheduling.md) and answers the scheduler with decisions, never by driving
it: `plan(running)` returns the passes of the coming step in order (the running requests, the waiting ones, each
with its mode's options and the condition under which it is skipped); `max_num_seqs` is how many requests may run
at once; `reserves_full_length` whether admission reserves blocks for the whole length (prompt + max_tokens, so
nothing is ever preempted); and, for static batching, which batch each request belongs to (a batch holds its slots
until the whole batch has left). `Scheduler.schedule()` runs the passes a plan names; the passes themselves, and
every change to the requests, are the scheduler's.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from refengine.config import BatchingMode, SchedulerConfig

if TYPE_CHECKING:
    from refengine.request import Request


class PassKind(enum.Enum):
    RUNNING = "running"  # the running requests, in admission order: each gets its next chunk or decode
    WAITING = "waiting"  # the waiting queue, from its head: admitted while blocks, budget and max_num_seqs allow


@dataclass(frozen=True)
class SchedulingPass:
    """One pass of a step, as a mode plans it."""

    kind: PassKind
    # running pass: leave out the requests that would decode (sequence mode: a step is all prefill or all decode)
    prefill_only: bool = False
    # waiting pass: a member whose prompt does not fit the budget joins now and prefills in a later step (static)
    admit_without_budget: bool = False
    # skipped when an earlier pass of the step preempted someone (vLLM: no admission in a step that preempted)
    unless_preempted: bool = False
    # skipped when an earlier pass of the step scheduled anything (sequence mode: decode only when nothing prefills)
    unless_scheduled: bool = False


RUNNING = SchedulingPass(PassKind.RUNNING)
WAITING = SchedulingPass(PassKind.WAITING)


def in_prefill(req: Request) -> bool:
    """True while tokens of the prompt (or, after recompute, of prompt + output) remain to be computed."""
    return req.num_computed_tokens < max(req.num_prompt_tokens, req.num_tokens - 1)


class ContinuousBatching:
    """Iteration-level: running requests first, then, only if nobody was preempted, waiting ones join."""

    mode = BatchingMode.CONTINUOUS
    reserves_full_length = False  # blocks are allocated as tokens are computed; running out preempts

    def __init__(self, config: SchedulerConfig) -> None:
        self.max_num_seqs = config.max_num_seqs

    def plan(self, running: Sequence[Request]) -> tuple[SchedulingPass, ...]:
        """The passes of the step about to be scheduled, in order (`running`: the running requests now)."""
        return (RUNNING, SchedulingPass(PassKind.WAITING, unless_preempted=True))

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

    def plan(self, running: Sequence[Request]) -> tuple[SchedulingPass, ...]:
        if any(in_prefill(r) for r in running):  # unfinished prefills first, with the newly admitted ones
            return (SchedulingPass(PassKind.RUNNING, prefill_only=True), WAITING)
        return (WAITING, SchedulingPass(PassKind.RUNNING, unless_scheduled=True))


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

    def plan(self, running: Sequence[Request]) -> tuple[SchedulingPass, ...]:
        if running:
            return (RUNNING,)
        self._batch_id += 1
        self.batch_of = {rid: b for rid, b in self.batch_of.items() if b == self._batch_id - 1}
        return (SchedulingPass(PassKind.WAITING, admit_without_budget=True),)

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
