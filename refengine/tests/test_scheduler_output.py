"""The scheduler -> runner contract, model-free: a shadow runner that knows only the SchedulerOutputs (as the model
runner does) must hold, after every step of random traces in every batching mode, preemption mode and with prefix
caching, exactly the block ids and computed-token counts the scheduler holds, and every scheduled request must be
described once: as new when the runner has not met it, as cached (resumed after a preemption) otherwise. And the
contract has no defaults: a field that its one builder (`Scheduler._make_output`) forgets fails the first step."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

import refengine.scheduler.scheduler as scheduler_module
from refengine.request import Request
from refengine.sampling_params import SamplingParams
from refengine.scheduler import Scheduler
from refengine.scheduler.scheduler_output import SchedulerOutput

EOS = 0
STEPS = 150


class ShadowRunner:
    """The model runner's view of the requests, built from the SchedulerOutputs alone."""

    def __init__(self) -> None:
        self.blocks: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.num_tokens: dict[str, int] = {}  # tokens the runner knows: prompt + what it sampled

    def apply(self, out: SchedulerOutput) -> None:
        for rid in out.finished_req_ids:
            for d in (self.blocks, self.computed, self.num_tokens):
                d.pop(rid, None)
        described = [n.req_id for n in out.scheduled_new_reqs] + out.scheduled_cached_reqs.req_ids
        assert sorted(described) == sorted(out.num_scheduled_tokens), "each scheduled request described once"
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.blocks, f"{new.req_id} sent as new twice"
            self.blocks[new.req_id] = list(new.block_ids)
            self.computed[new.req_id] = new.num_computed_tokens + out.num_scheduled_tokens[new.req_id]
            self.num_tokens[new.req_id] = len(new.all_token_ids)
        c = out.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            assert rid in self.blocks, f"{rid} sent as cached before the runner met it"
            if rid in c.resumed_req_ids:
                self.blocks[rid] = list(c.new_block_ids[i] or [])
            else:
                assert c.num_computed_tokens[i] == self.computed[rid], f"{rid}: computed tokens jumped"
                self.blocks[rid] += c.new_block_ids[i] or []
            if rid in c.all_token_ids:
                self.num_tokens[rid] = len(c.all_token_ids[rid])
            self.computed[rid] = c.num_computed_tokens[i] + out.num_scheduled_tokens[rid]

    def sampling(self, out: SchedulerOutput) -> list[str]:
        """The requests the runner samples for: those whose every known token is now computed."""
        return [r for r in out.num_scheduled_tokens if self.computed[r] >= self.num_tokens[r]]


CONFIGS = list(itertools.product(("continuous", "sequence", "static", "none"), ("recompute", "swap"), (True, False)))


@pytest.mark.parametrize("batching,preemption_mode,enable_prefix_caching", CONFIGS)
def test_shadow_runner_agrees_with_the_scheduler(batching, preemption_mode, enable_prefix_caching):
    rng = random.Random(CONFIGS.index((batching, preemption_mode, enable_prefix_caching)))
    sched = Scheduler(
        eos_token_id=EOS,
        max_num_batched_tokens=24,
        max_num_seqs=4,
        block_size=4,
        num_gpu_blocks=12,
        num_cpu_blocks=12,
        batching=batching,
        preemption_mode=preemption_mode,
        enable_prefix_caching=enable_prefix_caching,
        long_prefill_token_threshold=10,
    )
    shadow, next_id, shared = ShadowRunner(), 0, [rng.randrange(1, 50) for _ in range(8)]
    preemptions = 0
    for step in range(STEPS):
        if step < STEPS - 40 and rng.random() < 0.5:
            prompt = (shared if rng.random() < 0.5 else []) + [rng.randrange(1, 50) for _ in range(rng.randint(1, 20))]
            sp = SamplingParams(max_tokens=rng.randint(1, 12), temperature=0.0)
            sched.add_request(Request(f"r{next_id}", prompt, sp, eos_token_id=EOS))
            next_id += 1
        if sched.running and rng.random() < 0.05:
            sched.finish_requests(rng.choice(sched.running).request_id)
        out = sched.schedule()
        preemptions += len(out.preempted_req_ids)
        shadow.apply(out)
        for rid in out.num_scheduled_tokens:
            req = sched.requests[rid]
            assert shadow.blocks[rid] == sched.kv_cache_manager.get_block_ids(rid), f"step {step}: {rid} blocks"
            assert shadow.computed[rid] == req.num_computed_tokens, f"step {step}: {rid} computed tokens"
        samplers = shadow.sampling(out)
        assert samplers == [
            r for r in out.num_scheduled_tokens if sched.requests[r].num_computed_tokens == sched.requests[r].num_tokens
        ]
        sampled = {r: [EOS if rng.random() < 0.1 else rng.randrange(1, 50)] for r in samplers}
        for r, toks in sampled.items():
            shadow.num_tokens[r] += len(toks)
        sched.update_from_output(out, sampled)
        sched.check_invariants()
    if batching == "continuous":
        assert preemptions > 0  # the trace did exercise preemption and resumption


OUTPUT_FIELDS = [f.name for f in dataclasses.fields(SchedulerOutput)]


@pytest.mark.parametrize("forgotten", OUTPUT_FIELDS)
def test_a_field_the_builder_forgets_fails_at_once(monkeypatch, forgotten):
    """The real builder, made to leave one field out: schedule() raises a TypeError naming the field, where a default
    would have handed the runner an empty list or a zero that reads as "nothing to do" (a preemption it never swaps
    out, a finished request whose row it keeps)."""
    built = scheduler_module.SchedulerOutput

    def forgetful(**given: object) -> SchedulerOutput:
        given.pop(forgotten)
        return built(**given)  # type: ignore[arg-type]  # (the builder's own keyword arguments, less one)

    monkeypatch.setattr(scheduler_module, "SchedulerOutput", forgetful)
    sched = Scheduler(eos_token_id=EOS, max_num_batched_tokens=16, max_num_seqs=2, block_size=4, num_gpu_blocks=8)
    sched.add_request(Request("r0", [1, 2, 3], SamplingParams(max_tokens=2), eos_token_id=EOS))
    with pytest.raises(TypeError, match=rf"missing 1 required keyword-only argument: '{forgotten}'"):
        sched.schedule()
