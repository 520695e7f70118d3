"""The state every scheduler step must leave behind, as assertions; the conformance suite checks it after every step
(through `Scheduler.check_invariants`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from refengine.limits import cdiv
from refengine.request import RequestStatus

if TYPE_CHECKING:
    from refengine.scheduler import Scheduler


def check_scheduler_invariants(sched: Scheduler) -> None:
    c, kv = sched.config, sched.kv_cache_manager
    kv.check_invariants()
    limit = sched.batching.max_num_seqs  # (max_num_seqs; 1 without batching)
    assert len(sched.running) <= limit, f"{len(sched.running)} running > {limit} allowed"
    waiting = list(sched.waiting)
    assert not set(map(id, waiting)) & set(map(id, sched.running)), "a request is both waiting and running"
    for r in sched.running:
        assert r.status == RequestStatus.RUNNING, r
        held = len(kv.req_to_blocks.get(r.request_id, []))
        need = cdiv(r.num_computed_tokens, c.block_size)
        if sched.batching.reserves_full_length:
            assert held >= need, f"{r} holds {held} blocks, needs {need}"
        else:
            assert held == need, f"{r} holds {held} blocks, its computed tokens need {need}"
    for r in sched.running + waiting:
        p, f, st = r.num_output_placeholders, r.num_in_flight_tokens, r.num_stale_output_tokens
        assert p >= 0 and 0 <= st <= f, f"{r}: placeholders {p}, in flight {f}, stale {st}"
        assert c.async_scheduling or not p, f"{r} has {p} output placeholders without async scheduling"
    for r in waiting:
        assert not r.num_output_placeholders, f"waiting {r} has output placeholders"
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), r
        assert r.request_id not in kv.req_to_blocks or not kv.req_to_blocks[r.request_id], f"waiting {r} holds blocks"
        assert (r.request_id in kv.swapped) == (r.num_computed_tokens > 0), f"waiting {r} computed tokens vs swap"
