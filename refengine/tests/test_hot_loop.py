"""The inlined running pass of the scheduler (`Scheduler._schedule_running`) against the helpers it copies.

`_schedule_running` runs for every running request every step, so it inlines `_num_new_tokens`, `in_prefill` and
`_schedule`, and asks the KV manager for blocks only when `has_room` says it must. `reference_running_pass` below
is the same pass written with those helpers (and allocate_slots called every time). Hypothesis draws a scheduler
configuration and a history of steps (sync or async, with preemptions, prefix hits and finished requests); from
the state it leaves, both passes run on copies of the scheduler and must leave the same step and the same state.
"""

from __future__ import annotations

import copy
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refengine.config import SchedulingPolicy
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams
from refengine.scheduler import Scheduler
from refengine.scheduler.batching import in_prefill
from refengine.scheduler.scheduler import _Step
from refengine.scheduler.scheduler_output import SchedulerOutput

EOS = 0


def reference_running_pass(sched: Scheduler, step: _Step, prefill_only: bool = False) -> None:
    """_schedule_running, spelled with the helper functions it inlines."""
    running, chunked = sched.running, sched.config.enable_chunked_prefill
    i = 0
    while i < len(running) and step.budget > 0:
        req = running[i]
        computed, placeholders = req.num_computed_tokens, req.num_output_placeholders
        if placeholders and computed + 2 - placeholders >= req.num_prompt_tokens + req.sampling_params.max_tokens:
            i += 1  # async: its token in flight is its last
            continue
        full = sched._num_new_tokens(step, req, computed)
        n = min(full, step.budget)
        if n <= 0 or (n < full and not chunked) or (prefill_only and not in_prefill(req)):
            i += 1
            continue
        while sched.kv_cache_manager.allocate_slots(req, n) is None:
            victim = sched.preemption.pick_victim(running)
            if running.index(victim) < i:
                i -= 1
            sched._preempt(victim, step)
            if victim is req:
                break
        if req.status != RequestStatus.RUNNING:
            if sched.preemption.policy is SchedulingPolicy.PRIORITY:
                continue
            break
        sched._schedule(step, req, n)
        i += 1


def _config(draw) -> dict:
    policy = draw(st.sampled_from(["fcfs", "priority"]))
    return dict(
        max_num_batched_tokens=draw(st.integers(4, 64)),
        max_num_seqs=draw(st.integers(1, 8)),
        block_size=draw(st.sampled_from([1, 2, 4, 8])),
        num_gpu_blocks=draw(st.integers(8, 48)),
        num_cpu_blocks=draw(st.sampled_from([0, 16])),
        enable_chunked_prefill=draw(st.booleans()),
        long_prefill_token_threshold=draw(st.sampled_from([0, 3, 8])),
        enable_prefix_caching=draw(st.booleans()),
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        policy=policy,
        batching=draw(st.sampled_from(["continuous", "sequence"])),
        async_scheduling=draw(st.booleans()),
        max_model_len=draw(st.sampled_from([64, 1 << 30])),
    )


@st.composite
def scheduler_states(draw) -> Scheduler:
    """A scheduler after a drawn history of steps (under async scheduling, maybe with its last step in flight)."""
    knobs = _config(draw)
    sched = Scheduler(eos_token_id=EOS, **knobs)
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    limit = min(knobs["num_gpu_blocks"] * knobs["block_size"], knobs["max_model_len"]) - 1
    if not knobs["enable_chunked_prefill"]:
        limit = min(limit, knobs["max_num_batched_tokens"])  # (Processor refuses the others)
    in_flight: list[tuple[SchedulerOutput, dict[str, list[int]]]] = []
    for step in range(draw(st.integers(0, 16))):
        for k in range(rng.choice([0, 1, 1, 2])):
            prompt_len = rng.randint(1, max(1, min(limit // 2, rng.choice([4, 12, 40]))))
            prompt = [rng.choice([1, 2, 3]) for _ in range(prompt_len)]  # few symbols: prefix hits happen
            max_tokens = rng.randint(1, max(1, min(limit - prompt_len, rng.choice([2, 3, 8, 40]))))
            sched.add_request(
                Request(
                    f"s{step}-{k}",
                    prompt,
                    SamplingParams(max_tokens=max_tokens),
                    priority=rng.randint(0, 2),
                    arrival_time=float(step),
                )
            )
        before = {r.request_id: r.num_output_placeholders for r in sched.running}
        out = sched.schedule()
        samples = {}
        for rid in out.num_scheduled_tokens:
            req = sched.requests[rid]
            sampled = (
                req.num_output_placeholders > before.get(rid, 0)
                if knobs["async_scheduling"]
                else req.num_computed_tokens == req.num_tokens
            )
            if sampled:
                samples[rid] = [EOS if rng.random() < 0.05 else rng.randint(1, 49)]
        in_flight.append((out, samples))
        if not knobs["async_scheduling"] or len(in_flight) > 1:
            sched.update_from_output(*in_flight.pop(0))
    if draw(st.integers(0, 3)) == 0:  # (else, under async scheduling, the next pass runs with a step in flight)
        for pending in in_flight:
            sched.update_from_output(*pending)
    return sched


def _snapshot(sched: Scheduler, step: _Step) -> tuple:
    reqs = sorted(
        (r.request_id, r.status, r.num_computed_tokens, r.num_output_placeholders, r.num_preemptions, r.num_lost_tokens)
        for r in [*sched.running, *sched.waiting]
    )
    kv = sched.kv_cache_manager
    blocks = {rid: [b.block_id for b in bl] for rid, bl in kv.req_to_blocks.items()}
    return (
        dict(step.num_scheduled_tokens),
        list(step.num_scheduled_tokens),
        dict(step.is_prefill),
        list(step.preempted_req_ids),
        list(step.blocks_to_swap_out),
        step.budget,
        [r.request_id for r in sched.running],
        [r.request_id for r in sched.waiting],
        reqs,
        blocks,
        dict(kv.num_cached_blocks),
        kv.num_free_blocks,
        sched.num_preemptions,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduler_states(), st.booleans())
def test_inlined_running_pass_matches_its_helpers(sched: Scheduler, prefill_only: bool) -> None:
    fast, slow = sched, copy.deepcopy(sched)
    step_fast, step_slow = fast._new_step(), slow._new_step()
    fast._schedule_running(step_fast, prefill_only=prefill_only)
    reference_running_pass(slow, step_slow, prefill_only=prefill_only)
    assert _snapshot(fast, step_fast) == _snapshot(slow, step_slow)
