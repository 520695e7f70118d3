"""`--executor serial|pool[:N]|ray[:ADDRESS]`: which executor runs a plan's runs, parsed and checked before any run.

- `serial`: one run after another in this process (the only choice for real-device runs by default: two in-process
  runs on one CPU or GPU would time each other);
- `pool[:N]`: N local worker processes (default `os.cpu_count()`), for simulated runs only: a simulated run's
  numbers are the cost model's virtual clock, so runs side by side cannot disturb each other's results;
- `ray[:ADDRESS]`: one Ray task per run on the cluster `ray.init(address=ADDRESS)` reaches (no address:
  `ray.init()`, which starts a local cluster unless RAY_ADDRESS is set). A simulated run asks for one CPU, a CUDA run
  for one GPU, so that on a GPU cluster every run has a GPU of its own.

With no `--executor`, a plan whose every run is simulated goes to a pool, any other plan runs serially. What a plan
is, for these checks: its device and, when its runs go to a server, the server backend's name (`RunPlan.server`).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from refengine.sim.sim_device import DeviceSpec

KINDS = ("serial", "pool", "ray")
RAY_MISSING = "--executor ray needs Ray: pip install 'cbbench[ray]'"
_FORM = "expected serial, pool, pool:N (N worker processes) or ray, ray:ADDRESS"


@dataclass(frozen=True)
class ExecutorChoice:
    """What `--executor` names: `kind`, a pool's worker count, a Ray cluster's address."""

    kind: str
    workers: int | None = None  # pool: processes (None: os.cpu_count())
    address: str | None = None  # ray: the cluster (None: ray.init()'s own choice)

    @property
    def spelled(self) -> str:
        """The choice as `--executor` spells it ("pool:4", "ray:auto"): what the results JSON records."""
        arg = self.workers if self.kind == "pool" else self.address
        return self.kind if arg is None else f"{self.kind}:{arg}"

    def describe(self, num_runs: int | None = None) -> str:
        """`pool (2 worker processes)`: what `--dry-run` and the closing note print."""
        if self.kind == "pool":
            n = pool_size(self, num_runs)
            return f"pool ({n} worker process{'es' if n != 1 else ''})"
        if self.kind == "ray":
            return f"ray ({self.address or 'ray.init() default: RAY_ADDRESS or a local cluster'})"
        return "serial"


def parse_executor(text: str | None) -> ExecutorChoice | None:
    """The choice `--executor TEXT` names; None when it was not given (the plan's default applies)."""
    if text is None:
        return None
    kind, sep, arg = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS or (kind == "serial" and sep):
        raise ValueError(f"executor: {_FORM}, got {text!r}")
    if kind == "pool" and sep:
        if not re.fullmatch(r"\s*\d+\s*", arg) or int(arg) < 1:
            raise ValueError(f"executor: pool:N takes a worker count >= 1, got {text!r}")
        return ExecutorChoice("pool", workers=int(arg))
    if kind == "ray" and sep:
        if not arg.strip():
            raise ValueError(
                f"executor: ray:ADDRESS needs an address (e.g. ray:auto or ray:10.0.0.1:6379), got {text!r}"
            )
        return ExecutorChoice("ray", address=arg.strip())
    return ExecutorChoice(kind)


def pool_size(choice: ExecutorChoice, num_runs: int | None) -> int:
    """A pool's processes: as asked (default one per CPU), never more than the runs it has to do."""
    n = choice.workers or os.cpu_count() or 1
    return max(1, min(n, num_runs)) if num_runs else n


def is_simulated(device: DeviceSpec, server: str | None) -> bool:
    """Every run of a plan is on a simulated GPU: an in-process backend (engine or peer) on `sim:<gpu>`. A server
    backend's runs are real HTTP runs whatever `--device` says (it only picks the workload's defaults there)."""
    return device.simulated and server is None


def check_executor(choice: ExecutorChoice | None, device: DeviceSpec, server: str | None) -> None:
    """ValueError, one line naming the option, for an executor that cannot run the runs of a plan on `device` (sent
    to the backend `server`, when they go to one)."""
    if choice is None or choice.kind == "serial":
        return
    if choice.kind == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError(RAY_MISSING)
    if is_simulated(device, server):
        return
    if server is not None:
        raise ValueError(
            f"executor: {choice.kind} with --backend {server}: every run goes to the "
            "one server, and runs side by side would time each other; use --executor serial"
        )
    if choice.kind == "pool":
        raise ValueError(
            f"executor: pool runs simulated runs only (--device sim:<gpu>); runs on {device.name} in processes "
            "of one host would time each other; use --executor serial, or --executor ray with a GPU per run"
        )
    if device.is_cpu:
        raise ValueError(
            "executor: ray runs simulated runs, or CUDA runs with a GPU each; CPU runs would share "
            "their hosts' cores; use --executor serial"
        )
    if device.name not in ("cuda", "cuda:0"):
        raise ValueError(f"executor: ray gives each run a GPU of its own (cuda); got --device {device.name}")


def resolve_executor(
    choice: ExecutorChoice | None, device: DeviceSpec, server: str | None, num_runs: int
) -> ExecutorChoice:
    """The executor that runs `num_runs` runs of a plan: the choice (checked), else the default, which is a pool
    when every run is simulated and there is more than one run and one CPU, else serial."""
    check_executor(choice, device, server)
    if choice is not None:
        return choice
    if is_simulated(device, server) and num_runs > 1 and (os.cpu_count() or 1) > 1:
        return ExecutorChoice("pool")
    return ExecutorChoice("serial")
