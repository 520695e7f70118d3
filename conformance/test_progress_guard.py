"""The progress guard (conformance/progress.py) against schedulers stuck on purpose: a livelock of preemption fails
within its window, a loop inside one step fails at the watchdog, each with the stuck state in the message; a
scheduler that makes progress runs to the end under it."""

from __future__ import annotations

import pytest

from conformance.adapters.refengine_adapter import RefEngineAdapter
from conformance.fake_runner import EOS_TOKEN_ID
from conformance.progress import EngineStuck, guarded
from conformance.test_scheduler_examples import prompt, step
from refengine.scheduler import Scheduler
from refengine.scheduler.preemption import PreemptionPolicy


class PreemptsEquals(PreemptionPolicy):
    """Priority preemption that also takes a running request as urgent as the waiting one."""

    def victim_to_admit(self, req, running):
        if not self.preempts_to_admit or not running:
            return None
        victim = self.pick_victim(running)
        return victim if victim.priority >= req.priority else None


class StopsAfterPreempting(Scheduler):
    """With PreemptsEquals, and admission that stops once it preempted: the victim and the request it gave way to
    take turns, step after step, each re-prefill thrown away before it samples."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.preemption.__class__ = PreemptsEquals

    def _preempt_for(self, req, step) -> bool:
        super()._preempt_for(req, step)
        return False  # (the caller then stops admitting for this step)


class LoopsInStep(Scheduler):
    """With PreemptsEquals as is: the victim is readmitted and preempted again inside one schedule(), its tokens
    given back each time, for ever."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.preemption.__class__ = PreemptsEquals


def _adapter(scheduler_cls, budget: int = 4):
    cls = guarded(type(f"{scheduler_cls.__name__}Adapter", (RefEngineAdapter,), {"scheduler_cls": scheduler_cls}))
    a = cls(
        eos_token_id=EOS_TOKEN_ID,
        policy="priority",
        priority_preemption=True,
        max_num_seqs=1,
        block_size=4,
        num_gpu_blocks=32,
        max_num_batched_tokens=budget,  # 4: prompts chunked over steps; 64: a whole prompt in one step
        enable_prefix_caching=False,
    )
    for i in range(2):
        a.add_request(f"r{i}", prompt(10, 1000 * (i + 1)), max_tokens=4, priority=2, arrival_time=i)
    return a


def _drain(a) -> None:
    while not all(a.request(f"r{i}").status == "finished" for i in range(2)):
        step(a)


def test_a_livelock_of_preemption_fails_with_the_requests_taking_turns():
    a = _adapter(StopsAfterPreempting)
    with pytest.raises(EngineStuck) as info:
        _drain(a)
    msg = str(info.value)
    assert "invariant `progress` violated" in msg and "no request sampled a token or finished" in msg, msg
    assert "free device blocks:" in msg and "waiting (" in msg and "running (" in msg, msg
    assert msg.count("preempted=['r") >= 2, msg  # the last decisions show the preemptions repeating
    assert a.progress_guard.steps <= 10 + 4 + 16 + 2  # within the window: the longest request's tokens + slack


def test_a_loop_inside_one_step_fails_at_the_watchdog(monkeypatch):
    monkeypatch.setattr("conformance.progress.STEP_HANG_S", 0.5)  # the mechanism, quickly
    a = _adapter(LoopsInStep, budget=64)
    with pytest.raises(EngineStuck) as info:
        _drain(a)
    msg = str(info.value)
    assert "a loop inside the step" in msg and "never returned" in msg, msg
    assert "preempted=" in msg and "x)" in msg, msg  # the victim's preemption count, in its thousands


def test_a_scheduler_that_makes_progress_runs_to_the_end_under_the_guard():
    a = _adapter(Scheduler)
    _drain(a)
    assert [a.request(f"r{i}").num_output_tokens for i in range(2)] == [4, 4]
    assert a.progress_guard.idle == 0
