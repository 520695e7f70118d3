"""Waiting for an event in a test without making its timing the check.

A test that waits for something asynchronous (a server's answer, a request leaving the engine) needs a limit, or a
bug hangs the run. That limit is a hang guard: generous enough that no load on a shared machine reaches it (the
waits it guards take seconds at worst), and what the test then asserts is the order of events or a count (engine
steps), never how long it took. refengine/tests/test_no_wall_time_asserts.py keeps wall-time assertions out of the
tests; the hang guards live here, in one place, with one limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Far past any wait the suite makes (a server's first chunk, a drain: seconds; model loads are outside these waits).
HANG_GUARD_S = 300.0
POLL_S = 0.02


class HangGuard(AssertionError):
    """An event a test waits for never came: a hang (or a dead server), not a slow machine."""


def wait_for(cond: Callable[[], object], what: str, hang_guard_s: float = HANG_GUARD_S) -> None:
    """Return once `cond()` is true; fail (HangGuard) if it is still false after `hang_guard_s`."""
    deadline = time.monotonic() + hang_guard_s
    while not cond():
        if time.monotonic() > deadline:
            raise HangGuard(f"{what}: never happened ({hang_guard_s:g} s hang guard)")
        time.sleep(POLL_S)
