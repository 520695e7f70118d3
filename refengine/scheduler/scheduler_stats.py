"""SchedulerStats: what `Scheduler.make_stats()` reports, so that the engine, the server's metrics and the perf
suite read the scheduler's state without reaching into its KV manager or its mode."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    # prefix caching, since the scheduler was made: tokens of admitted requests, and those found in the cache; a
    # readmission after a recompute preemption is counted in the preempted pair instead (vLLM's PrefixCacheStats)
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_preempted_queries: int
    prefix_cache_preempted_hits: int
    # static batching: the batch now running (1, 2, ...); None in the other modes
    static_batch_id: int | None = None
    # every scheduled (in the step asked about) or running request -> its batch, which holds its slot until the
    # whole batch has left (static batching); None in the other modes, where a finished request frees its slot at once
    batch_ids: dict[str, int | None] = field(default_factory=dict)
