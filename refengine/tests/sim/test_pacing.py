"""A served simulated GPU paces each step to the virtual clock: a step of X simulated ms takes ~X wall ms."""

from __future__ import annotations

import asyncio
import time

from refengine import LLMEngine
from refengine.entrypoints.async_engine import AsyncLLMEngine
from refengine.sim.clock import VirtualClock
from refengine.sim.pacing import StepPacer
from refengine.tests.sim.helpers import params

# how late a paced step may end: one sleep's wake-up plus the host's own work, on a shared 2-core machine under load
PACING_SLACK_S = 0.15


def test_a_paced_step_takes_its_simulated_time():
    clock = VirtualClock()
    step_s = 0.25
    pacer = StepPacer(clock, lambda: clock.advance(step_s) or [])
    for _ in range(2):
        start = time.monotonic()
        pacer.step()
        wall = time.monotonic() - start
        assert step_s <= wall + 1e-3 < step_s + PACING_SLACK_S  # (1 ms: the pacer's and this test's clock reads)


def test_a_host_slower_than_the_step_is_not_slept_and_virtual_time_catches_up():
    clock = VirtualClock()
    naps: list[float] = []

    def slow_step() -> list:
        time.sleep(0.1)  # the host takes 100 ms for a step the GPU would run in 10 ms
        clock.advance(0.01)
        return []

    pacer = StepPacer(clock, slow_step, sleep=naps.append)
    pacer.step()
    pacer.step()
    assert naps == []
    assert clock.now() >= 0.1  # the second step started at the wall's virtual time, not 10 ms in


def _serve_one(pace: bool, max_tokens: int) -> tuple[float, dict, float]:
    engine = LLMEngine("opt-13b", device="sim:a100")  # ~15 ms per decode step: slow enough to see the pacing

    async def main() -> tuple[float, dict]:
        server = AsyncLLMEngine(engine, "opt-13b", pace_sim=pace)
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


def test_the_server_paces_a_simulated_engine_and_not_when_told_not_to():
    wall, m, busy = _serve_one(True, 40)
    virtual = m["finish_time"] - m["arrival_time"]
    assert busy > 0.4  # 40 decode steps of opt-13b on an A100
    assert busy <= wall + 1e-3 and abs(wall - virtual) < PACING_SLACK_S
    unpaced_wall, _, unpaced_busy = _serve_one(False, 40)
    assert unpaced_busy == busy and unpaced_wall < busy / 2  # the sim alone runs far faster than real time
