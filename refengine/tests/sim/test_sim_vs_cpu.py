"""The simulated GPU runs the real scheduler: on the same workload and knobs it makes exactly the decisions the CPU
engine makes (who runs, how many tokens, who is preempted, who finishes), step by step."""

from __future__ import annotations

import pytest
import torch

from refengine import LLMEngine
from refengine.tests.sim.helpers import params, workload

# tight enough that continuous batching preempts, small enough that the CPU forwards stay quick
KNOBS = {"num_gpu_blocks": 14, "block_size": 8, "max_num_batched_tokens": 48, "max_num_seqs": 5}


def _decisions(engine: LLMEngine, reqs) -> list[tuple]:
    log: list[tuple] = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        log.append((dict(out.num_scheduled_tokens), list(out.preempted_req_ids), sorted(out.finished_req_ids)))
        return out

    engine.scheduler.schedule = recording_schedule
    for i, (prompt, n, _) in enumerate(reqs):
        engine.add_request(str(i), prompt, params(n))
    finished = []
    while engine.has_unfinished_requests():
        finished += [(o.request_id, len(o.outputs[0].token_ids)) for o in engine.step() if o.finished]
    log.append(finished)
    return log


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's forwards are faster on one thread of a shared machine
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("batching", "async_scheduling"), [("continuous", False), ("continuous", True), ("static", False)]
)
def test_sim_scheduler_decisions_equal_the_cpu_engines(batching, async_scheduling, one_thread):
    reqs = workload(10, seed=4, prompt_len=(10, 50), out_len=(1, 20))
    kw = dict(KNOBS, batching=batching, async_scheduling=async_scheduling)
    cpu = _decisions(LLMEngine("tiny-qwen2", device="cpu", **kw), reqs)
    sim = _decisions(LLMEngine("tiny-qwen2", device="sim:h100", **kw), reqs)
    assert sim == cpu
    if batching == "continuous":  # the knobs are tight enough that the comparison covers preemption
        assert any(preempted for _, preempted, _ in cpu[:-1])
