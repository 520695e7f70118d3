"""The adaptive time scale of a served simulated GPU (refengine/sim/time_scale.py), on fake clocks: when it slows
down and to what, what it ignores, when it speeds up, and an adaptive pacer that ends up keeping up with a host
the real-time clock could not."""

from __future__ import annotations

import pytest

from refengine.clock import VirtualClock
from refengine.sim import time_scale as ts
from refengine.sim.pacing import StepPacer
from refengine.sim.time_scale import ScaleController, check_time_scale
from refengine.tests.sim.test_pacing import FakeWall

STEP_S = 0.01  # a simulated decode step


def _feed(c: ScaleController, scale: float, host_s: float, n: int, wall: float, dt: float = 0.1) -> tuple[float, float]:
    """n steps of STEP_S that each took the host `host_s`, `dt` wall seconds apart; (scale, wall) after them."""
    for _ in range(n):
        wall += dt
        scale = c.observe(scale, host_s, STEP_S, wall)
    return scale, wall


def test_a_host_over_its_share_slows_the_clock_to_the_target_share():
    c = ScaleController(started=0.0)
    cost = 0.03 / STEP_S  # 30 ms of host work per 10 ms step: 3 wall seconds per simulated second
    scale, _ = _feed(c, 1.0, 0.03, ts.SLOW_DOWN_WINDOW, wall=10.0)
    assert scale == pytest.approx(ts.TARGET_HOST_SHARE / cost, rel=10 ** (1 - ts.SCALE_DIGITS))
    assert scale <= ts.TARGET_HOST_SHARE / cost  # rounded down, never up


def test_a_fresh_clock_slows_down_at_once():
    c = ScaleController(started=10.0)  # a server that has just started, on a host it cannot keep up with
    scale, wall = _feed(c, 0.25, 0.03, ts.SLOW_DOWN_WINDOW, wall=10.0, dt=0.01)
    assert scale < 0.25 and wall - 10.0 < ts.MIN_DWELL_S


def test_one_slow_step_moves_nothing_and_a_share_between_the_bounds_holds():
    c = ScaleController(started=0.0)
    held = 0.5 * (ts.SLOW_DOWN_SHARE + ts.SPEED_UP_SHARE)  # a share inside the band
    scale, wall = _feed(c, 1.0, held * STEP_S, ts.SPEED_UP_WINDOW, wall=10.0)
    assert scale == 1.0
    scale, wall = _feed(c, scale, 50 * STEP_S, 1, wall)  # another process took the core for one step
    scale, wall = _feed(c, scale, held * STEP_S, 1, wall)
    assert scale == 1.0


def test_the_clock_speeds_up_only_when_every_recent_step_had_room_and_not_within_the_dwell():
    c = ScaleController(started=0.0)
    light = 0.15 * STEP_S / 0.25  # a share of 0.15 at scale 0.25
    scale, wall = _feed(c, 0.25, light, ts.SPEED_UP_WINDOW, wall=0.0, dt=0.01)
    assert scale == 0.25 and wall < ts.SPEED_UP_DWELL_S  # room, but the clock started less than a dwell ago
    scale, wall = _feed(c, 0.25, light, 1, wall=ts.SPEED_UP_DWELL_S)
    assert scale == pytest.approx(0.25 * ts.TARGET_HOST_SHARE / 0.15, rel=1e-2)  # to the target share
    c2 = ScaleController(started=-100.0)
    costly = [light] * (ts.SPEED_UP_WINDOW - 1) + [5 * light]  # one step in the window used 75% of its time
    for i, h in enumerate(costly):
        assert c2.observe(0.25, h, STEP_S, 1.0 + i * 0.01) == 0.25


def test_two_changes_are_at_least_the_dwell_apart():
    c = ScaleController(started=0.0)
    scale, wall = _feed(c, 1.0, 0.03, ts.SLOW_DOWN_WINDOW, wall=10.0, dt=0.01)
    assert scale < 1.0
    changed = scale
    scale, wall = _feed(c, scale, 0.3, 20, wall, dt=0.01)  # ten times costlier, 0.2 s later: too soon to act
    assert scale == changed and wall - 10.0 < ts.MIN_DWELL_S
    scale, _ = _feed(c, scale, 0.3, ts.SLOW_DOWN_WINDOW, wall=10.0 + ts.MIN_DWELL_S)
    assert scale < changed


def test_the_clock_never_runs_slower_than_its_floor_nor_faster_than_real_time():
    c = ScaleController(started=-100.0)
    assert _feed(c, 1.0, 1000.0, ts.SLOW_DOWN_WINDOW, wall=0.0)[0] == ts.MIN_TIME_SCALE
    c = ScaleController(started=-100.0)
    assert _feed(c, 0.5, 0.0, ts.SPEED_UP_WINDOW, wall=0.0)[0] == 1.0


@pytest.mark.parametrize("ok", [None, 1.0, 0.01])
def test_check_time_scale_takes_none_or_a_fraction(ok):
    assert check_time_scale(ok) == ok


def test_an_adaptive_pacer_slows_until_a_slow_host_keeps_up():
    """A host that needs 30 ms per 10 ms step is late at real time; the adaptive pacer slows down until the host's
    work fits, after which no step is late (every step sleeps) and simulated time is the steps' own."""
    clock, wall = VirtualClock(), FakeWall()

    def step() -> list:
        wall.t += 0.03
        clock.advance(STEP_S)
        return []

    pacer = StepPacer(clock, step, sleep=wall.sleep, wall=wall, time_scale=None)
    pacer._set_scale(1.0, wall.t)  # as if it had sped up: the worst start, real time
    for _ in range(50):
        pacer.step()
    settled, naps, sim = pacer.scale, len(wall.naps), clock.now()
    for _ in range(100):
        pacer.step()
    assert settled * 0.03 / STEP_S <= ts.SLOW_DOWN_SHARE  # the host's share of each step's wall time now fits
    assert pacer.scale == settled and len(wall.naps) == naps + 100  # and it holds: every step slept
    assert clock.now() - sim == pytest.approx(100 * STEP_S, abs=1e-9)  # no host lateness became simulated time
