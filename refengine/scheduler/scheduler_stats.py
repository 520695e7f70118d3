"""SchedulerStats: what `Scheduler.make_stats()` reports, so that the engine, the server's metrics and the perf
suite read the scheduler's state without reaching into its KV manager or its mode; `scheduler_stats` reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from refengine.kv_cache.kv_cache_manager import KVCacheManager
    from refengine.request import Request
    from refengine.scheduler.batching import ContinuousBatching
    from refengine.scheduler.request_queue import FCFSQueue, PriorityQueue
    from refengine.scheduler.scheduler_output import SchedulerOutput


@dataclass(frozen=True)
class SchedulerStats:
    num_running_reqs: int
    num_waiting_reqs: int
    running_req_ids: list[str]  # in scheduling order
    num_used_blocks: int  # device KV blocks held by requests
    num_free_blocks: int  # device KV blocks free now (cached-but-free ones included)
    kv_cache_usage: float  # num_used_blocks / all device blocks, in [0, 1]
    num_preemptions: int  # since the scheduler was made
    num_swap_outs: int  # the preemptions that went to the host pool rather than recompute
    # prefix caching, since the scheduler was made: tokens of admitted requests, and those found in the cache
    prefix_cache_queries: int
    prefix_cache_hits: int
    # static batching: the batch now running (1, 2, ...); None in the other modes
    static_batch_id: int | None = None
    # every scheduled (in the step asked about) or running request -> its batch, which holds its slot until the
    # whole batch has left (static batching); None in the other modes, where a finished request frees its slot at once
    batch_ids: dict[str, int | None] = field(default_factory=dict)


class _SchedulerState(Protocol):
    """What the stats read of refengine/scheduler/scheduler.py's Scheduler."""

    running: list[Request]
    waiting: FCFSQueue | PriorityQueue
    kv_cache_manager: KVCacheManager
    batching: ContinuousBatching
    num_prefix_cache_queries: int
    num_prefix_cache_hits: int

    @property
    def num_preemptions(self) -> int: ...
    @property
    def num_swap_outs(self) -> int: ...


def scheduler_stats(sched: _SchedulerState, scheduler_output: SchedulerOutput | None = None) -> SchedulerStats:
    """The scheduler's state now; with `scheduler_output`, also the batch of each request it scheduled."""
    kv, mode = sched.kv_cache_manager, sched.batching
    running = [r.request_id for r in sched.running]
    scheduled = list(scheduler_output.num_scheduled_tokens) if scheduler_output is not None else []
    return SchedulerStats(
        num_running_reqs=len(running),
        num_waiting_reqs=len(sched.waiting),
        running_req_ids=running,
        num_used_blocks=kv.num_used_blocks,
        num_free_blocks=kv.num_free_blocks,
        kv_cache_usage=kv.usage,
        num_preemptions=sched.num_preemptions,
        num_swap_outs=sched.num_swap_outs,
        prefix_cache_queries=sched.num_prefix_cache_queries,
        prefix_cache_hits=sched.num_prefix_cache_hits,
        static_batch_id=mode.batch_id,
        batch_ids=mode.batch_ids(scheduled, running),
    )
