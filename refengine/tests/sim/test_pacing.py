"""A served simulated GPU paces each step to the virtual clock: a step of X simulated ms takes ~X / scale wall ms.

The arithmetic runs on a fake wall clock (`FakeWall`: the pacer's sleeps and the host's work advance it); two tests
measure the real pacing of a real step and of the async engine, with a slack named below.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from refengine import LLMEngine
from refengine.engine.clock import VirtualClock
from refengine.entrypoints.async_engine import AsyncLLMEngine
from refengine.sim.pacing import StepPacer
from refengine.tests.sim.helpers import params

# how late a paced step may end: one sleep's wake-up plus the host's own work, on a shared 2-core machine under load
PACING_SLACK_S = 0.15
EXACT = 1e-9  # fake-clock arithmetic: only float rounding


class FakeWall:
    """A wall clock that moves only when the pacer sleeps or the (fake) host works."""

    def __init__(self) -> None:
        self.t = 100.0
        self.naps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.naps.append(s)
        self.t += s


def _pacer(step_s: float, host_s: float, scale: float | None) -> tuple[StepPacer, VirtualClock, FakeWall]:
    """A pacer whose every step is `step_s` simulated seconds and costs the host `host_s` wall seconds."""
    clock, wall = VirtualClock(), FakeWall()

    def step() -> list:
        wall.t += host_s
        clock.advance(step_s)
        return []

    return StepPacer(clock, step, sleep=wall.sleep, wall=wall, time_scale=scale), clock, wall


def test_a_step_takes_its_simulated_time_divided_by_the_scale_and_the_host_work_is_absorbed():
    pacer, clock, wall = _pacer(step_s=0.02, host_s=0.01, scale=0.5)
    start = wall.t
    for _ in range(10):
        pacer.step()
    # busy: each step starts where the last ended, so the host's 10 ms never become simulated time
    assert clock.now() == pytest.approx(10 * 0.02, abs=EXACT)
    assert wall.t - start == pytest.approx(10 * 0.02 / 0.5, abs=EXACT)
    assert wall.naps == pytest.approx([0.04 - 0.01] * 10, abs=EXACT)
    assert pacer.host_s == pytest.approx(0.01, abs=EXACT)


def test_a_host_slower_than_the_step_is_not_slept_and_its_lateness_becomes_simulated_time():
    pacer, clock, wall = _pacer(step_s=0.01, host_s=0.1, scale=0.5)
    pacer.step()
    pacer.step()
    assert wall.naps == []
    # each step's outputs are out 100 wall ms after it began: 50 simulated ms at half speed
    assert clock.now() == pytest.approx(2 * 0.1 * 0.5, abs=EXACT)


def test_idle_time_passes_in_virtual_time_at_the_scale_and_arrivals_are_stamped_on_it():
    pacer, clock, wall = _pacer(step_s=0.02, host_s=0.0, scale=0.25)
    pacer.step()
    pacer.idle()
    wall.t += 2.0  # nothing to run for two wall seconds
    assert pacer.now() == pytest.approx(0.02 + 2.0 * 0.25, abs=EXACT)  # what an arrival now is stamped with
    pacer.step()
    assert clock.now() == pytest.approx(0.02 + 0.5 + 0.02, abs=EXACT)


def test_a_change_of_scale_keeps_the_mapping_continuous():
    pacer, _, wall = _pacer(step_s=0.02, host_s=0.0, scale=None)  # adaptive: starts below real time
    w, v, scale = pacer.reading()
    assert w == wall.t and v == pacer.now() and scale == pacer.scale < 1
    before = pacer.now()
    pacer._set_scale(1.0, wall.t)
    assert pacer.now() == pytest.approx(before, abs=EXACT)
    wall.t += 1.0
    assert pacer.now() == pytest.approx(before + 1.0, abs=EXACT)


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, float("nan"), float("inf")])
def test_a_fixed_scale_outside_0_1_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="^time_scale: "):
        StepPacer(VirtualClock(), lambda: [], time_scale=bad)


def test_a_paced_step_takes_its_simulated_time():
    clock = VirtualClock()
    step_s = 0.25
    pacer = StepPacer(clock, lambda: clock.advance(step_s) or [])
    for _ in range(2):
        start = time.monotonic()
        pacer.step()
        wall = time.monotonic() - start
        assert step_s <= wall + 1e-3 < step_s + PACING_SLACK_S  # (1 ms: the pacer's and this test's clock reads)


def _serve_one(pace: bool, max_tokens: int, scale: float | None) -> tuple[float, dict, float]:
    engine = LLMEngine("opt-13b", device="sim:a100")  # ~15 ms per decode step: slow enough to see the pacing

    async def main() -> tuple[float, dict]:
        server = AsyncLLMEngine(engine, "opt-13b", pace_sim=pace, time_scale=scale)
        server.start()
        queue: asyncio.Queue = asyncio.Queue()
        start = time.monotonic()
        await server.add_request("r", [5, 6, 7], params(max_tokens), queue)
        while True:
            _, out = await queue.get()
            if out.finished:
                break
        wall = time.monotonic() - start
        await server.shutdown()
        return wall, out.metrics

    wall, metrics = asyncio.run(main())
    return wall, metrics, engine.model_runner.busy_seconds


def test_the_server_paces_a_simulated_engine_at_its_scale_and_not_when_told_not_to():
    for scale in (1.0, 0.5):
        wall, m, busy = _serve_one(True, 40, scale)
        virtual = m["finish_time"] - m["arrival_time"]
        assert busy > 0.4  # 40 decode steps of opt-13b on an A100
        assert busy <= wall * scale + 1e-3 and abs(wall * scale - virtual) < PACING_SLACK_S
    unpaced_wall, _, unpaced_busy = _serve_one(False, 40, None)
    assert unpaced_busy == busy and unpaced_wall < busy / 2  # the sim alone runs far faster than real time
