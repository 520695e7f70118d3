"""One progress guard for every test that drives an engine step by step: a scheduler that stops making progress
fails the test at once, with the state it is stuck in, instead of hanging the run until CI's limit.

Progress is a request gaining an output token or leaving the engine (finished, aborted). While requests are
unfinished, the most urgent one gains at least one token of compute per step (docs/scheduling.md: it is never a
victim, and the token budget is at least one), so it samples within its own token count of steps, plus a few steps
of slack (async scheduling delivers a token one step late; a swap-in or a step that only preempts). The guard fails
after that many steps without progress (the longest live request's tokens + SLACK_STEPS); a livelock of preemption
(requests admitted and preempted in turn, none ever reaching its next token) is caught there. It also fails past `max_steps` steps in all, which catches a
request that never finishes although it keeps gaining tokens (a runaway past max_tokens).

A stuck engine may also never return from one step: a loop inside `schedule()` (a victim preempted and readmitted
over and over within the step, its tokens given back to the budget each time). No step count sees that, so each
guarded step runs under a watchdog (SIGALRM, in the main thread where signals are delivered): past `STEP_HANG_S`
(`ENGINE_STEP_HANG_S` for an engine step, which runs the model) the step is interrupted and the test fails with the
state it was in. A step here takes milliseconds; the limits are hundreds of times that, hang guards that no load
reaches, never timing checks.

The failure (`EngineStuck`, an AssertionError) shows the waiting and running requests, the free blocks and the last
`HISTORY` decisions. `for_adapter` guards a SchedulerAdapter (the examples, the state machine, the recorded traces and
the differentials, whatever the engine), `for_engine` a refengine LLMEngine (the engine helpers, the engine-level
differential); `guarded_generate` is `LLM.generate` under the guard.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

HISTORY = 12  # decisions shown when the guard fails: enough to see a cycle of preemptions repeat
# Steps a request may go without sampling beyond its own token count (one token of compute per step): async
# scheduling's token in flight, a step that only preempts, a swap-in, a static batch waiting for its last member.
SLACK_STEPS = 16
# Steps any one guarded adapter or generate() call may take in all: a test's scenario needs tens to a few thousand;
# past this, something keeps running that should have finished (the state machine's teardown has its own, tighter
# liveness bound).
DEFAULT_MAX_STEPS = 20_000
# One step's wall-time limit before the watchdog calls it a hang. A scheduler step without a model (the adapters)
# takes well under a millisecond to a few ms here (the 12000-token example's is the largest); an engine step runs
# the model too (the tiny model's prefill of a few hundred tokens: tens of ms). Both limits are hundreds of times
# that, so no load comes near them; a loop inside a step is caught this long after it starts, and a Hypothesis
# example that loops costs this much per shrink attempt (hence the short one for the state machine's steps).
STEP_HANG_S = 5.0
ENGINE_STEP_HANG_S = 60.0


class EngineStuck(AssertionError):
    """The engine stopped making progress (or never finished): the message holds its state and last decisions."""


@dataclass
class Live:
    """What the guard needs of one unfinished request."""

    request_id: str
    num_output_tokens: int
    num_tokens: int  # prompt + outputs


class ProgressGuard:
    """Call `step(decision)` after each engine step: it fails the test when no request has sampled or left for
    `window` steps, or past `max_steps` steps."""

    def __init__(
        self,
        what: str,
        live: Callable[[], Iterable[Live]],
        describe: Callable[[], str],
        *,
        max_steps: int = DEFAULT_MAX_STEPS,
        slack: int = SLACK_STEPS,
    ) -> None:
        self.what, self.live, self.describe = what, live, describe
        self.max_steps, self.slack = max_steps, slack
        self.steps = 0
        self.idle = 0  # steps since the last progress
        self.seen: dict[str, int] = {}  # request id -> output tokens, at the last step
        self.decisions: deque[str] = deque(maxlen=HISTORY)

    def step(self, decision: str = "") -> None:
        self.steps += 1
        self.decisions.append(f"step {self.steps}: {decision}")
        now = {v.request_id: v for v in self.live()}
        gained = any(v.num_output_tokens > self.seen.get(rid, v.num_output_tokens) for rid, v in now.items())
        left = any(rid not in now for rid in self.seen)
        self.idle = 0 if gained or left or not now else self.idle + 1
        self.seen = {rid: v.num_output_tokens for rid, v in now.items()}
        window = max((v.num_tokens for v in now.values()), default=0) + self.slack
        if self.idle > window:
            self.fail(f"no request sampled a token or finished in {self.idle} steps (bound {window})")
        if self.steps > self.max_steps:
            self.fail(f"still running after {self.max_steps} steps")

    @contextmanager
    def watch(self, limit_s: float | None = None) -> Iterator[None]:
        """Run one step under the watchdog: past `limit_s` (STEP_HANG_S) it fails with the state the step is in."""
        limit_s = STEP_HANG_S if limit_s is None else limit_s
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            yield  # (signals reach the main thread only: elsewhere the step count is the only guard)
            return

        def on_alarm(signum, frame) -> None:
            self.decisions.append(f"step {self.steps + 1}: never returned")
            self.fail(f"one step ran for over {limit_s:g} s: a loop inside the step")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def fail(self, why: str) -> None:
        # (named as the state machine names its invariants: the stuck state is a violation of `progress`)
        lines = [f"invariant `progress` violated: {self.what} stopped making progress: {why}", self.describe()]
        lines.append("last decisions:")
        lines += [f"  {d}" for d in self.decisions]
        raise EngineStuck("\n".join(lines))


# ---- a SchedulerAdapter ----------------------------------------------------------------------------------------------
def _fmt_view(v) -> str:
    return (
        f"{v.request_id}(prio={v.priority} arr={v.arrival_time:g} prompt={v.num_prompt_tokens} "
        f"out={v.num_output_tokens} computed={v.num_computed_tokens} blocks={len(v.block_ids)} "
        f"preempted={v.num_preemptions}x)"
    )


def describe_adapter(adapter) -> str:
    running, waiting = adapter.running(), adapter.waiting()
    return "\n".join(
        [
            f"  free device blocks: {adapter.num_free_blocks()} of {adapter.num_gpu_blocks}",
            f"  running ({len(running)}): " + "; ".join(map(_fmt_view, running)),
            f"  waiting ({len(waiting)}): " + "; ".join(map(_fmt_view, waiting)),
        ]
    )


def decision_line(step) -> str:
    """One StepView as a line of the guard's history."""
    line = f"scheduled={step.num_scheduled_tokens} preempted={step.preempted_req_ids} new={step.new_req_ids}"
    if step.blocks_to_swap_out or step.blocks_to_swap_in:
        line += f" swap_out={len(step.blocks_to_swap_out)} swap_in={len(step.blocks_to_swap_in)}"
    return line


def for_adapter(adapter, what: str = "", **kw) -> ProgressGuard:
    def live() -> list[Live]:
        return [Live(v.request_id, v.num_output_tokens, v.num_tokens) for v in adapter.running() + adapter.waiting()]

    return ProgressGuard(
        what or getattr(adapter, "name", type(adapter).__name__), live, lambda: describe_adapter(adapter), **kw
    )


_GUARDED: dict[type, type] = {}


def guarded(adapter_cls):
    """`adapter_cls` with every `schedule()` under a progress guard of its own instance (the same class if it is
    guarded already): conftest.py's `adapter_cls` fixture hands this to every adapter-driven test, so the examples,
    the state machine and the trace replays all fail with the stuck state rather than loop on a stuck engine."""
    if getattr(adapter_cls, "progress_guarded", False):
        return adapter_cls
    if adapter_cls in _GUARDED:  # one class per adapter class: `guarded(A) is guarded(A)`
        return _GUARDED[adapter_cls]

    def schedule(self):
        guard = self.__dict__.get("progress_guard")
        if guard is None:
            guard = self.__dict__["progress_guard"] = for_adapter(self, getattr(self, "name", adapter_cls.__name__))
        with guard.watch():
            out = adapter_cls.schedule(self)
        guard.step(decision_line(out))
        return out

    cls = type(
        adapter_cls.__name__,
        (adapter_cls,),
        {"schedule": schedule, "progress_guarded": True, "__doc__": adapter_cls.__doc__, "__module__": __name__},
    )
    _GUARDED[adapter_cls] = cls
    return cls


# ---- a refengine LLMEngine -------------------------------------------------------------------------------------------
def for_engine(engine, what: str = "refengine LLMEngine", **kw) -> ProgressGuard:
    sched = engine.scheduler

    def live() -> list[Live]:
        return [Live(r.request_id, r.num_output_tokens, r.num_tokens) for r in sched.requests.values()]

    def fmt(r) -> str:
        return (
            f"{r.request_id}(prio={r.priority} prompt={r.num_prompt_tokens} out={r.num_output_tokens} "
            f"computed={r.num_computed_tokens} preempted={r.num_preemptions}x)"
        )

    def describe() -> str:
        return "\n".join(
            [
                f"  free device blocks: {sched.num_free_blocks}",
                f"  running ({len(sched.running)}): " + "; ".join(map(fmt, sched.running)),
                f"  waiting ({len(sched.waiting)}): " + "; ".join(map(fmt, list(sched.waiting))),
            ]
        )

    return ProgressGuard(what, live, describe, **kw)


def engine_decision(engine) -> str:
    """The scheduler's last decisions, as far as the engine keeps them (its step counters)."""
    s = engine.scheduler
    return f"running={len(s.running)} waiting={len(s.waiting)} preemptions so far={s.num_preemptions}"


def guarded_generate(llm, prompts, sampling_params, **kw):
    """`LLM.generate` (whole completions, in prompt order) with each engine step under the progress guard."""
    engine = llm.llm_engine
    guard = for_engine(engine)
    step = engine.step

    def guarded_step():
        with guard.watch(ENGINE_STEP_HANG_S):
            outs = step()
        guard.step(engine_decision(engine))
        return outs

    engine.step = guarded_step  # (on the instance: LLM.generate's loop calls engine.step())
    try:
        return llm.generate(prompts, sampling_params, **kw)
    finally:
        del engine.step
