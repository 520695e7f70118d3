"""A served simulated GPU paces each step to the virtual clock: a step of X simulated ms takes X / scale wall ms.

Everything runs on a fake wall clock (`FakeWall`: the pacer's sleeps and the host's work advance it), the server's
pacer too (it reads `refengine.sim.pacing.time`, replaced by the test): the tests check the pacer's decisions, never
how long the machine took (that is a benchmark's business).
"""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from refengine import LLMEngine
from refengine.clock import VirtualClock
from refengine.entrypoints.async_engine import AsyncLLMEngine
from refengine.sim import pacing
from refengine.sim.pacing import StepPacer
from refengine.tests.sim.helpers import params

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


def test_a_paced_step_sleeps_its_simulated_time_on_the_real_clock_by_default():
    """The pacer's decisions on a fake wall: a step of 0.25 simulated seconds that costs the host nothing is slept
    for 0.25 wall seconds, step after step; and a pacer built without a clock paces on the real one."""
    pacer, clock, wall = _pacer(step_s=0.25, host_s=0.0, scale=1.0)
    for _ in range(3):
        pacer.step()
    assert wall.naps == pytest.approx([0.25] * 3, abs=EXACT)
    assert clock.now() == pytest.approx(0.75, abs=EXACT) and not pacer.late
    real = StepPacer(VirtualClock(), lambda: [])
    assert (real._sleep, real._wall) == (time.sleep, time.monotonic)


def _serve_one(pace: bool, max_tokens: int, scale: float | None, monkeypatch) -> tuple[FakeWall, float, dict, float]:
    """One request served by a simulated opt-13b on an A100, the pacer on a fake wall clock (it moves only when the
    pacer sleeps): (the wall, its seconds from the request's arrival to its last output, the request's metrics,
    the runner's simulated busy seconds)."""
    wall = FakeWall()
    monkeypatch.setattr(pacing, "time", types.SimpleNamespace(monotonic=wall, sleep=wall.sleep))
    engine = LLMEngine("opt-13b", device="sim:a100")

    async def main() -> tuple[float, dict, float]:
        server = AsyncLLMEngine(engine, "opt-13b", pace_sim=pace, time_scale=scale)
        server.start()
        queue: asyncio.Queue = asyncio.Queue()
        start = wall()
        await server.add_request("r", [5, 6, 7], params(max_tokens), queue)
        while True:
            _, out = await queue.get()
            if out.finished:
                break
        elapsed = wall() - start
        busy = engine.model_runner.busy_seconds  # (before the shutdown, which lets go of the runner)
        await server.shutdown()
        return elapsed, out.metrics, busy

    elapsed, metrics, busy = asyncio.run(main())
    return wall, elapsed, metrics, busy


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_the_server_paces_a_simulated_engine_at_its_scale(scale, monkeypatch):
    wall, elapsed, m, busy = _serve_one(True, 40, scale, monkeypatch)
    virtual = m["finish_time"] - m["arrival_time"]
    assert busy > 0.4  # 40 decode steps of opt-13b on an A100
    # every step was slept to its simulated end at the scale: the fake wall moved by the busy time / scale
    assert sum(wall.naps) == pytest.approx(busy / scale, rel=1e-9)
    assert elapsed * scale == pytest.approx(virtual, abs=1e-9) and virtual == pytest.approx(busy, rel=1e-9)


def test_the_server_does_not_pace_when_told_not_to(monkeypatch):
    wall, elapsed, m, busy = _serve_one(False, 40, None, monkeypatch)
    assert busy > 0.4 and wall.naps == [] and elapsed == 0.0
