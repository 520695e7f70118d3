"""The simulated hf-static peer (perf/sim/hf_static.py): its steps, its timestamps and its padding."""

from __future__ import annotations

import pytest

from cbbench.perf.sim.hf_static import batch_steps, simulate_hf_static
from refengine.sim.cost_model import CostModel, StepShape
from refengine.tests.sim.shapes import LLAMA_31_8B


class TokenCost:
    """A step costs 1 ms per scheduled token plus 1 us per key attended: distinct, hand-computable step times."""

    def step_seconds(self, step: StepShape) -> float:
        keys = sum(c + q for c, q in zip(step.context_tokens, step.new_tokens))
        return sum(step.new_tokens) * 1e-3 + keys * 1e-6


@pytest.fixture(scope="module")
def h200() -> CostModel:
    return CostModel("h200", LLAMA_31_8B, "bfloat16")


def test_a_batch_is_one_padded_prefill_then_a_decode_per_further_token() -> None:
    steps = batch_steps([3, 5], [2, 4])
    assert steps[0] == StepShape((5, 5), (0, 0), 2)  # both rows padded to the longest prompt
    assert steps[1:] == [StepShape((1, 1), (5 + j, 5 + j), 2) for j in range(3)]  # every row, until the longest ends


def test_timestamps_follow_the_steps_of_each_batch() -> None:
    # batch 1: prompts 3 and 5 (padded to 5), outputs 2 and 4; batch 2 (one request) arrives while batch 1 runs
    res = simulate_hf_static(TokenCost(), [(3, 2, 0.0), (5, 4, 0.0), (2, 1, 0.001)], batch_size=2)
    prefill = 10e-3 + 10e-6
    decodes = [2e-3 + 2 * (6 + j) * 1e-6 for j in range(3)]
    t = [prefill, prefill + decodes[0], prefill + sum(decodes[:2]), prefill + sum(decodes)]
    a, b, c = res.records
    assert a["token_times"] == t[:2] and b["token_times"] == t
    assert a["first_token_time"] == b["first_token_time"] == t[0]
    assert a["finish_time"] == b["finish_time"] == t[3]  # a request returns with its batch
    assert c["first_scheduled_time"] == t[3] and c["token_times"] == pytest.approx([t[3] + 2e-3 + 2e-6], rel=1e-12)
    assert res.duration_s == c["finish_time"] and res.batch_seconds == pytest.approx([t[3], 2e-3 + 2e-6], rel=1e-12)
    assert [s["num_running"] for s in res.steps] == [2, 2, 1, 1, 1]


def test_a_batch_lasts_the_sum_of_its_steps_modelled_times(h200) -> None:
    reqs = [(512, 40, 0.0), (300, 7, 0.0), (90, 128, 0.0), (700, 1, 0.0)]
    res = simulate_hf_static(h200, reqs, batch_size=4)
    steps = batch_steps([r[0] for r in reqs], [r[1] for r in reqs])
    assert len(steps) == 128
    assert res.batch_seconds[0] == pytest.approx(sum(h200.step_seconds(s) for s in steps), rel=1e-12)
    assert res.duration_s == res.batch_seconds[0]


def test_one_long_prompt_slows_the_whole_batch(h200) -> None:
    short = [(200, 64, 0.0)] * 8
    padded = short[:7] + [(4000, 64, 0.0)]
    base, slow = simulate_hf_static(h200, short, 8), simulate_hf_static(h200, padded, 8)
    assert slow.duration_s > base.duration_s
    # the short prompts wait for the long one's prefill, and every decode attends over the padded length
    assert slow.records[0]["first_token_time"] > base.records[0]["first_token_time"]
    decode_time = [r["finish_time"] - r["first_token_time"] for r in (slow.records[0], base.records[0])]
    assert decode_time[0] > decode_time[1]


def test_results_are_deterministic(h200) -> None:
    reqs = [(100 + 37 * i % 900, 1 + 53 * i % 300, 0.01 * i) for i in range(40)]
    assert simulate_hf_static(h200, reqs, 6) == simulate_hf_static(CostModel("h200", LLAMA_31_8B), reqs, 6)


def test_bad_input_names_the_field(h200) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        simulate_hf_static(h200, [(10, 1, 0.0)], 0)
    with pytest.raises(ValueError, match="output_lens"):
        batch_steps([10], [0])


def test_a_workload_maps_to_prompt_and_output_lengths_with_arrivals() -> None:
    from types import SimpleNamespace

    from cbbench.perf.sim.hf_static import workload_requests

    reqs = [
        SimpleNamespace(prompt_token_ids=[5] * n, output_len=o, arrival_time=a)
        for n, o, a in ((3, 2, 0.5), (7, 9, 0.0))
    ]
    assert workload_requests(SimpleNamespace(requests=reqs)) == [(3, 2, 0.5), (7, 9, 0.0)]


def test_simulated_hf_static_reports_its_requests_done_to_the_progress_line() -> None:
    from cbbench.perf.backends.hf import run_hf_static
    from cbbench.workloads.workload import Workload, WorkloadRequest

    reqs = [WorkloadRequest([1] * (3 + i), output_len=2 + i) for i in range(5)]
    done: list[int] = []
    res = run_hf_static(
        Workload("w", {}, reqs), "qwen2.5-0.5b", device="sim:h200", dtype=None, max_num_seqs=2, progress=done.append
    )
    assert len(res.records) == 5 and sum(done) == 5  # the line read "0/5 requests" when the run had finished
