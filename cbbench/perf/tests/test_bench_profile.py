"""`cbbench bench-profile`'s measuring (perf/bench/profile.py): the phase clock charges nested time exclusively, a
real refengine run fills the phases a step has, and the instrument is gone afterwards."""

from __future__ import annotations

import time

import torch

from cbbench.perf.bench.phase_clock import PHASES, PhaseClock
from cbbench.perf.bench.profile import format_markdown, profile_run


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_phase_clock_charges_nested_time_to_the_inner_phase_only():
    clock = PhaseClock()
    outer = clock.timed(lambda: (_spin(0.02), clock.timed(_spin, "inner")(0.05)), "outer", is_step=True)
    outer()
    assert clock.steps == 1
    assert 0.045 < clock.spent["inner"] < 0.2
    assert 0.015 < clock.spent["outer"] < 0.045  # the inner 50 ms are not also the outer's


def test_refengine_profile_fills_the_step_phases_and_removes_its_instrument():
    from cbbench.perf.plan.load import resolve_tokenizer
    from cbbench.workloads.catalog import get_workload
    from refengine.engine.llm_engine import LLMEngine
    from refengine.scheduler import Scheduler

    step, schedule = LLMEngine.step, Scheduler.schedule
    workload = get_workload(
        "sharegpt",
        tokenizer=resolve_tokenizer("tiny-qwen2", None),
        num_prompts=3,
        seed=0,
        max_prompt_len=32,
        max_output_len=4,
    )
    with torch.inference_mode(False):
        run = profile_run("refengine", workload, model="tiny-qwen2", max_num_seqs=2)
    assert LLMEngine.step is step and Scheduler.schedule is schedule
    assert run["steps"] >= max(r.output_len for r in workload.requests)
    ms = run["phase_ms"]
    for phase in (
        "schedule",
        "input prep",
        "embedding",
        "attention",
        "mlp",
        "norms",
        "lm_head",
        "sampling other",
        "update",
        "outputs",
    ):
        assert ms[phase] > 0, phase
    assert ms["penalties"] == ms["seeded noise"] == ms["top-k/top-p"] == 0  # greedy, no penalties: never entered
    assert set(ms) == set(PHASES)
    assert "| lm_head |" in format_markdown([run], [])
