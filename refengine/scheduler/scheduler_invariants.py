"""The state every scheduler step must leave behind, as assertions; the conformance suite checks it after every step
(through `Scheduler.check_invariants`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from refengine.limits import cdiv
from refengine.request import Request, RequestStatus

if TYPE_CHECKING:
    from refengine.config import SchedulerConfig
    from refengine.kv_cache.kv_cache_manager import KVCacheManager
    from refengine.scheduler.batching import ContinuousBatching


def check_scheduler_invariants(
    c: SchedulerConfig,
    kv: KVCacheManager,
    mode: ContinuousBatching,
    running: list[Request],
    waiting_queue: Iterable[Request],
) -> None:
    """The scheduler's config, KV cache manager, batching mode, running list and waiting queue after a step."""
    kv.check_invariants()
    limit = mode.max_num_seqs  # (max_num_seqs; 1 without batching)
    assert len(running) <= limit, f"{len(running)} running > {limit} allowed"
    waiting = list(waiting_queue)
    assert not set(map(id, waiting)) & set(map(id, running)), "a request is both waiting and running"
    for r in running:
        assert r.status == RequestStatus.RUNNING, r
        held = kv.get_num_blocks(r.request_id)
        need = cdiv(r.num_computed_tokens, c.block_size)
        if mode.reserves_full_length:
            assert held >= need, f"{r} holds {held} blocks, needs {need}"
        else:
            assert held == need, f"{r} holds {held} blocks, its computed tokens need {need}"
    for r in running + waiting:
        p, f, st = r.num_output_placeholders, r.num_in_flight_tokens, r.num_stale_output_tokens
        assert p >= 0 and 0 <= st <= f, f"{r}: placeholders {p}, in flight {f}, stale {st}"
        assert c.async_scheduling or not p, f"{r} has {p} output placeholders without async scheduling"
    for r in waiting:
        assert not r.num_output_placeholders, f"waiting {r} has output placeholders"
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), r
        assert not kv.get_num_blocks(r.request_id), f"waiting {r} holds blocks"
        assert (r.request_id in kv.swapped) == (r.num_computed_tokens > 0), f"waiting {r} computed tokens vs swap"
