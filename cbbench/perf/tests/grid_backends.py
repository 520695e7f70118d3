"""The grid tests' backends: refengine's in-process backend, with one planned run whose worker dies.

Each is put into a built plan in place of the "refengine" backend (`plan.backends["refengine"] = ...`), so it is
pickled into the job with its marker folder, and its runs' rows are refengine's own. The marker files say which
attempt a worker is on, across processes:
- `HoldOnce`: the first attempt at the target run writes its pid to `held.pid` and waits to be killed (the test
  kills it with os.kill); the retry finds the file and runs;
- `DieOnce`: the first attempt kills its own process (SIGKILL); the retry finds the marker and runs;
- `DieAlways`: every attempt at the target run kills its own process.
Every attempt at the target appends its pid to `attempts.txt`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from cbbench.perf.backends.in_process import RefengineBackend

HOLD_S = 120.0  # how long a held worker waits to be killed: past it the run goes on and the test sees no retry


class _Target(RefengineBackend):
    def __init__(self, settings: Any, marker_dir: Path, target: str) -> None:
        super().__init__(settings)
        self.marker_dir, self.target = Path(marker_dir), target

    def run(self, spec: Any, progress: Any = None) -> Any:
        if spec.plan_id == self.target:
            with (self.marker_dir / "attempts.txt").open("a") as f:
                f.write(f"{os.getpid()}\n")
            self.on_target()
        return super().run(spec, progress)

    def on_target(self) -> None:
        raise NotImplementedError


class HoldOnce(_Target):
    def on_target(self) -> None:
        held = self.marker_dir / "held.pid"
        if held.exists():
            return
        tmp = held.with_suffix(".tmp")
        tmp.write_text(str(os.getpid()))
        tmp.rename(held)  # whole, or not there: the test never reads half a pid
        time.sleep(HOLD_S)


class DieOnce(_Target):
    def on_target(self) -> None:
        marker = self.marker_dir / "died"
        if not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)


class DieAlways(_Target):
    def on_target(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)
