"""How the gate ends on a signal: SIGTERM (a CI job cancelled), SIGHUP (its terminal closed) and SIGINT (Ctrl-C)
each raise `Interrupted` in the main thread, as Ctrl-C's KeyboardInterrupt does, so that every `finally` runs: the
runs' processes are killed, the worktrees and the scratch folder removed, the finished runs kept. The exit code is
128 + the signal's number (130, 143, 129), as a shell reports a process a signal ended. A second signal while the
gate cleans up does not cut the cleanup short: only the first one raises, and `deferred` holds every one back
while a step that must not stop halfway (a write of the results pair, a removal) runs.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """The gate was ended by signal `signum`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within: the first of HANDLED raises Interrupted; later ones are ignored (the cleanup of the first runs)."""
    fired: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if fired:
            return
        fired.append(signum)
        raise Interrupted(signum)

    try:
        old = {s: signal.signal(s, handler) for s in HANDLED}
    except ValueError:  # not the main thread (a test runner's worker): the defaults stay
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold HANDLED back while a step that must not stop halfway runs; a signal that came meanwhile is delivered
    (and raises) when it ends."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    except (ValueError, OSError, AttributeError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
