"""The sync Scheduler driven with two steps outstanding (two schedule() calls before update_from_output, as vLLM's
base Scheduler allows): a request preempted between them keeps the token its earlier step sampled (vLLM's
tests/v1/core test_preempt_during_execution), and a partial prefill's sample is still discarded."""

from __future__ import annotations

import pytest

from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams
from refengine.scheduler import Scheduler

BLOCK = 16
PROMPT_LEN = 80  # five full blocks each: two requests fill the ten-block cache
NUM_BLOCKS = 10
EOS = 7
SAMPLED = 42


def _scheduler(mode: str, budget: int = 100, num_blocks: int = NUM_BLOCKS) -> Scheduler:
    return Scheduler(
        eos_token_id=EOS,
        max_num_batched_tokens=budget,
        block_size=BLOCK,
        num_gpu_blocks=num_blocks,
        num_cpu_blocks=NUM_BLOCKS if mode == "swap" else 0,
        preemption_mode=mode,
        enable_prefix_caching=False,
    )


def _request(i: int, prompt_len: int = PROMPT_LEN, priority: int = 0) -> Request:
    return Request(
        f"r{i}",
        [100 + i * PROMPT_LEN + j for j in range(prompt_len)],
        SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0),
        arrival_time=float(i),
        priority=priority,
    )


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_between_two_outstanding_steps_keeps_its_token(mode):
    sched = _scheduler(mode)
    r0, r1 = _request(0), _request(1)
    sched.add_request(r0)
    out0 = sched.schedule()
    sched.add_request(r1)
    out1 = sched.schedule()  # r1's prefill, while r0's is still outstanding
    assert list(out0.num_scheduled_tokens) == ["r0"] and list(out1.num_scheduled_tokens) == ["r1"]
    sched.update_from_output(out0, {"r0": [0]})
    sched.schedule()  # r0's decode needs a sixth block: r1, the last admitted, is preempted
    assert r1.status == RequestStatus.PREEMPTED and sched.running == [r0]
    sched.update_from_output(out1, {"r1": [SAMPLED]})
    assert r1.output_token_ids == [SAMPLED]
    sched.check_invariants()


def test_a_preempted_partial_prefill_still_samples_nothing():
    sched = Scheduler(
        eos_token_id=EOS,
        max_num_batched_tokens=64,
        block_size=BLOCK,
        num_gpu_blocks=NUM_BLOCKS,
        enable_prefix_caching=False,
        policy="priority",
        priority_preemption=True,
    )
    r0 = _request(0, prompt_len=64)
    r1, r2 = _request(1, priority=5), _request(2, prompt_len=32)
    sched.add_request(r0)
    sched.update_from_output(sched.schedule(), {"r0": [0]})  # r0's whole prompt
    sched.add_request(r1)
    out1 = sched.schedule()  # r0's decode + r1's first 63 prompt tokens (a partial prefill)
    assert out1.num_scheduled_tokens == {"r0": 1, "r1": 63}
    sched.add_request(r2)
    sched.schedule()  # the more urgent r2 preempts r1, whose partial prefill is outstanding
    assert r1.status == RequestStatus.PREEMPTED
    sched.update_from_output(out1, {"r0": [0], "r1": [SAMPLED]})
    assert r0.output_token_ids == [0, 0] and r1.output_token_ids == []
    sched.check_invariants()


def test_preempted_after_its_last_prefill_chunk_keeps_its_token():
    sched = _scheduler("recompute", budget=64)
    r0, r1 = _request(0), _request(1)
    sched.add_request(r0)
    sched.update_from_output(sched.schedule(), {})
    sched.add_request(r1)
    out1 = sched.schedule()  # r0's last chunk + r1's first 48
    out2 = sched.schedule()  # r1's last 32: this step samples its first token
    assert out2.num_scheduled_tokens == {"r1": 32}
    sched.update_from_output(out1, {"r0": [0], "r1": [SAMPLED + 1]})  # r1's partial-prefill sample: discarded
    sched.schedule()  # r0's decode needs a sixth block: r1 is preempted, its last chunk outstanding
    assert r1.status == RequestStatus.PREEMPTED
    sched.update_from_output(out2, {"r1": [SAMPLED]})
    assert r1.output_token_ids == [SAMPLED]
    sched.check_invariants()
