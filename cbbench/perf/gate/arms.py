"""The gate's runs: the order of the two arms (ABBA), and one run of one arm as a fresh process of that arm's code.

Order: blocks of base, head, head, base. Within every block of four each arm holds the same mean position, so a
machine whose speed drifts linearly (a thermal or load trend, the 13% drift over ten runs seen on a shared CPU)
shifts both arms alike, and each arm runs first in a pair as often as second. A seeded random order would cancel
both only on average over many blocks; ABBA cancels them in every block, which matters at the few repeats a CI
job can afford. The two arms never run at once: one process at a time, each started fresh, so each pays the
same start-up and warm-up (perf's own `--warmup` requests, run in every process before it measures).

A run is `python -m cbbench.perf.cli perf ... --repeats 1 --output RUN.csv --quiet` in the arm's tree (or against
its server), with the gate's perf options; its rows are read back with the results reader, and the CPU time of the
process (user + system, the run and every process it waited for) is taken from the kernel's accounting.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from cbbench.perf.gate.trees import Tree
from cbbench.perf.results.columns import ResultRow

BASE, HEAD = "base", "head"
ARMS = (BASE, HEAD)


# The most runs per arm: a run of the smallest configuration takes seconds, so 1000 per arm is already hours of
# one machine; the order is a list, and an unbounded count would fill memory before the first run.
MAX_REPEATS = 1000


def check_repeat_count(repeats: int) -> None:
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"repeats must be in 1..{MAX_REPEATS}, got {repeats}")


def run_order(repeats: int) -> list[tuple[str, int]]:
    """(arm, its run index) for `repeats` runs per arm: base, head, head, base, base, head, ... (ABBA blocks; an odd
    `repeats` ends with one base, head pair)."""
    check_repeat_count(repeats)
    order: list[tuple[str, int]] = []
    for i in range(repeats):
        pair = (BASE, HEAD) if i % 2 == 0 else (HEAD, BASE)
        order += [(arm, i) for arm in pair]
    return order


@dataclass(frozen=True)
class Arm:
    """One side of the gate: a tree's code (`tree`) or a server (`url`), and how its processes start."""

    name: str  # BASE | HEAD
    describe: str  # how tables and messages name it: `main (1a2b3c4)`, `http://host:8000`
    cwd: Path
    env: Mapping[str, str]
    args: tuple[str, ...] = ()  # perf options of this arm alone (its --base-url)
    tree: Tree | None = None
    url: str | None = None


class ArmRow(ResultRow, total=False):
    """A row of an arm's run as the gate holds it: its results row, and the CPU seconds of the run's whole process
    (`process_cpu_s`: the same on every row of a run, gated once per run; written into the row's `extra`)."""

    process_cpu_s: float


@dataclass
class Run:
    """One finished run of one arm: its files, its rows (one per configuration, in plan order) and its cost."""

    arm: str
    index: int
    csv: Path
    rows: list[ArmRow]
    wall_s: float
    cpu_s: float


class ArmFailed(Exception):
    """A run of one arm failed: it exited non-zero, ran past its time limit, wrote nothing, or its results are not
    sound (soundness.py). `log`: its stderr, while it lasts (the gate keeps a copy beside its output)."""

    def __init__(self, arm: str, message: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.arm = arm
        self.log = log


def perf_argv(perf_args: Sequence[str], arm: Arm, output: Path, *, dry_run: bool = False) -> list[str]:
    argv = [sys.executable, "-m", "cbbench.perf.cli", "perf", *perf_args, *arm.args]
    argv += ["--repeats", "1", "--output", str(output), "--quiet"]
    return argv + (["--dry-run"] if dry_run else [])


def error_line(text: str) -> str:
    """The line of a failed run's stderr that says why: its last `error` line, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no output)"])[-1]


class RunTimedOut(Exception):
    """A run went past its time limit (it was killed, with every process it started)."""


POLL_S = 0.05  # how often a running process is looked at for its time limit (a wait costs no CPU between looks)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill `proc` and every process it started (its own session): no orphaned child of a run outlives the gate."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()


def _wait(proc: subprocess.Popen[bytes], limit_s: float | None) -> tuple[int, float]:
    """The exit code and CPU seconds (user + system) of `proc`, reaped here (Popen's own wait reports no usage);
    RunTimedOut past `limit_s` seconds."""
    deadline = None if limit_s is None else time.monotonic() + limit_s
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG if deadline is not None else 0)
            if pid:
                break
            if deadline is not None and time.monotonic() > deadline:
                _kill_group(proc)
                os.wait4(proc.pid, 0)
                proc.returncode = -signal.SIGKILL
                raise RunTimedOut(f"killed after its time limit of {limit_s:.0f} s")
            time.sleep(POLL_S)
    except RunTimedOut:
        raise
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: the run and its children go with the gate
        _kill_group(proc)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(proc.pid, 0)
        proc.returncode = -signal.SIGKILL
        raise
    with contextlib.suppress(OSError):  # (its children, if it left any running)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def start(arm: Arm, argv: Sequence[str], log: Path, limit_s: float | None = None) -> tuple[int, float, float, str]:
    """Run `argv` as `arm` (its cwd and environment, a session of its own), stdout and stderr into `log`.{out,err};
    returns (exit code, wall seconds, CPU seconds, stderr). RunTimedOut past `limit_s`."""
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    t0 = time.perf_counter()
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(
            list(argv), cwd=arm.cwd, env=dict(arm.env), stdout=fo, stderr=fe, start_new_session=True
        )
        code, cpu = _wait(proc, limit_s)
    return code, time.perf_counter() - t0, cpu, err.read_text(errors="replace")


PREFLIGHT_LIMIT_S = 600.0  # a dry run builds the plan and reads the workload; it measures nothing
_PLANNED = re.compile(r"(\d+) run\(s\)")


def preflight(arm: Arm, perf_args: Sequence[str], folder: Path) -> int:
    """`perf --dry-run` in the arm: ValueError naming the arm and its error line when it cannot run the options.
    Returns the number of configurations its plan holds (0 when its perf does not say)."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = perf_argv(perf_args, arm, folder / f"{arm.name}-dry-run.csv", dry_run=True)
    try:
        code, _, _, err = start(arm, argv, folder / f"{arm.name}-dry-run", PREFLIGHT_LIMIT_S)
    except RunTimedOut as e:
        raise ValueError(f"the {arm.name} arm ({arm.describe}): perf --dry-run {e}") from None
    if code != 0:
        raise ValueError(f"the {arm.name} arm ({arm.describe}) cannot run this configuration: {error_line(err)}")
    out = (folder / f"{arm.name}-dry-run.out").read_text(errors="replace")
    found = _PLANNED.search(out)
    return int(found.group(1)) if found else 0


def run_once(
    arm: Arm,
    index: int,
    perf_args: Sequence[str],
    folder: Path,
    read_rows: Callable[[Path], list[ResultRow]],
    limit_s: float | None = None,
) -> Run:
    """One measured run of `arm` into `folder`/`arm`-`index`.csv. ArmFailed (naming the run's stderr, `log`) when it
    exits non-zero, passes `limit_s`, or leaves no results that read."""
    folder.mkdir(parents=True, exist_ok=True)
    csv = folder / f"{arm.name}-{index:03d}.csv"
    what = f"{arm.name} run {index + 1} ({arm.describe})"
    try:
        code, wall, cpu, err = start(arm, perf_argv(perf_args, arm, csv), csv, limit_s)
    except RunTimedOut as e:
        raise ArmFailed(arm.name, f"{what} {e}", log=csv.with_suffix(".err")) from None
    if code != 0:
        raise ArmFailed(arm.name, f"{what} exited {code}: {error_line(err)}", log=csv.with_suffix(".err"))
    if not csv.is_file() or not csv.with_suffix(".json").is_file():
        raise ArmFailed(arm.name, f"{what} exited 0 but wrote no results", log=csv.with_suffix(".err"))
    try:
        rows = cast(list[ArmRow], read_rows(csv))  # (process_cpu_s is the gate's to add)
    except (ValueError, OSError) as e:
        raise ArmFailed(arm.name, f"{what} wrote results that do not read: {e}", log=csv.with_suffix(".err")) from None
    return Run(arm.name, index, csv, rows, wall, cpu)
