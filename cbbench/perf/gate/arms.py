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
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbbench.perf.gate.trees import Tree

BASE, HEAD = "base", "head"
ARMS = (BASE, HEAD)


def run_order(repeats: int) -> list[tuple[str, int]]:
    """(arm, its run index) for `repeats` runs per arm: base, head, head, base, base, head, ... (ABBA blocks; an odd
    `repeats` ends with one base, head pair)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
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


@dataclass
class Run:
    """One finished run of one arm: its files, its rows (one per configuration, in plan order) and its cost."""

    arm: str
    index: int
    csv: Path
    rows: list[dict[str, Any]]
    wall_s: float
    cpu_s: float
    meta: dict[str, Any] = field(default_factory=dict)


class ArmFailed(Exception):
    """A run of one arm exited non-zero (its last error line is the message)."""

    def __init__(self, arm: str, message: str) -> None:
        super().__init__(message)
        self.arm = arm


def perf_argv(perf_args: Sequence[str], arm: Arm, output: Path, *, dry_run: bool = False) -> list[str]:
    argv = [sys.executable, "-m", "cbbench.perf.cli", "perf", *perf_args, *arm.args]
    argv += ["--repeats", "1", "--output", str(output), "--quiet"]
    return argv + (["--dry-run"] if dry_run else [])


def error_line(text: str) -> str:
    """The line of a failed run's stderr that says why: its last `error` line, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no output)"])[-1]


def _wait(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """The exit code and CPU seconds (user + system) of `proc`, reaped here (Popen's own wait reports no usage)."""
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:  # Ctrl-C: the run goes with the gate
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(ChildProcessError):
            proc.wait()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def start(arm: Arm, argv: Sequence[str], log: Path) -> tuple[int, float, float, str]:
    """Run `argv` as `arm` (its cwd and environment), stdout and stderr into `log`.{out,err}; returns (exit code,
    wall seconds, CPU seconds, stderr)."""
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    t0 = time.perf_counter()
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(list(argv), cwd=arm.cwd, env=dict(arm.env), stdout=fo, stderr=fe)
        code, cpu = _wait(proc)
    return code, time.perf_counter() - t0, cpu, err.read_text(errors="replace")


def preflight(arm: Arm, perf_args: Sequence[str], folder: Path) -> None:
    """`perf --dry-run` in the arm: ValueError naming the arm and its error line when it cannot run the options."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = perf_argv(perf_args, arm, folder / f"{arm.name}-dry-run.csv", dry_run=True)
    code, _, _, err = start(arm, argv, folder / f"{arm.name}-dry-run")
    if code != 0:
        raise ValueError(f"the {arm.name} arm ({arm.describe}) cannot run this configuration: {error_line(err)}")


def run_once(
    arm: Arm, index: int, perf_args: Sequence[str], folder: Path, read_rows: Callable[[Path], list[dict[str, Any]]]
) -> Run:
    """One measured run of `arm` into `folder`/`arm`-`index`.csv (ArmFailed on a non-zero exit)."""
    folder.mkdir(parents=True, exist_ok=True)
    csv = folder / f"{arm.name}-{index:03d}.csv"
    code, wall, cpu, err = start(arm, perf_argv(perf_args, arm, csv), csv)
    if code != 0:
        raise ArmFailed(arm.name, f"{arm.name} run {index + 1} ({arm.describe}) exited {code}: {error_line(err)}")
    return Run(arm.name, index, csv, read_rows(csv), wall, cpu)
