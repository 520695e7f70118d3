"""The typed plan of one `cbbench perf` invocation, built once from the options and validated before anything runs.

`RunSettings` is what every run shares (model, device, dtype, seed, warm-up, tokenizer, the server's address);
`RunSpec` is one run (workload, backend, batching mode, knobs, load point, repeat); `RunPlan` holds the specs in the
order they run, the backends that run them, and where the results go. `build_plan` (plan/build.py) makes it;
`RunPlan.describe` is what `--dry-run` prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from cbbench.perf.knobs import EngineKnobs, KnobGrid
from cbbench.perf.plan.load import LoadPoint
from cbbench.perf.plan.options import knob_label
from cbbench.perf.results.writer import plan_id
from refengine.sim.cost_model import COST_MODEL_VERSION
from refengine.sim.sim_device import DeviceSpec

if TYPE_CHECKING:
    from cbbench.perf.backends.backend import Backend, RunResult
    from cbbench.perf.grid.executor import ExecutorChoice
    from cbbench.workloads.workload import Workload
    from refengine.tokenizer import Tokenizer


@dataclass
class RunSettings:
    """What every run of a plan shares. `tokenizer` and `dtype_name` are filled in as the plan is built."""

    model: str
    device: DeviceSpec
    dtype: str | None  # as given (None: the device's default)
    seed: int
    warmup: int
    cpu_threads: int | None
    repeats: int = 1
    base_url: str | None = None  # server backends
    prompt_format: str = "ids"
    ignore_eos: bool = True
    request_timeout: float = 6 * 3600
    client_workers: int = 1  # server backends: client processes (backends/client_workers.py)
    engine_knobs: KnobGrid = KnobGrid()  # as given: a server backend refuses them
    tokenizer: Tokenizer | None = None
    dtype_name: str = ""  # the resolved dtype ("float32", ...), the CSV's dtype column


class Entry(NamedTuple):
    """One configuration of a plan: `backend` runs in `batching` mode with `knobs`; `unset_in_id` names knobs that
    its id spells as unset (null) rather than leaving out."""

    backend: str
    batching: str
    knobs: EngineKnobs
    unset_in_id: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSpec:
    """One run: `backend` (a registered name) runs `workload` in `batching` mode with `knobs` at `load`."""

    backend: str
    batching: str
    knobs: EngineKnobs
    load: LoadPoint
    repeat: int
    workload: Workload
    load_label: str = ""  # the load point as the table names it ("" when the sweep has one)
    varying: frozenset[str] = frozenset()  # the knobs that differ between the plan's knob sets
    num_repeats: int = 1  # how many repeats the plan makes of this configuration
    unset_in_id: tuple[str, ...] = ()  # (Entry's)

    @property
    def plan_id(self) -> str:
        """What names this run in a results file before it runs (`--resume` skips the ids it holds)."""
        knobs: dict[str, object] = {**self.knobs.given(), **dict.fromkeys(self.unset_in_id)}
        return plan_id(self.backend, self.batching, knobs, self.load_label, self.repeat)

    def label_of(self, result: RunResult) -> str:
        """The run's label in the table and the JSON (the knobs as the engine resolved them)."""
        parts = (knob_label(result.knobs, set(self.varying)), self.load_label)
        return " ".join(x for x in parts if x and x != "-") or "-"

    def describe(self) -> str:
        """`refengine continuous, max_num_seqs=2, rate=4, repeat 1/2`: what `--dry-run` and the progress print."""
        parts = (
            f"{self.backend} {self.batching}",
            knob_label(self.knobs.given(), set(self.varying)),
            self.load_label,
            f"repeat {self.repeat + 1}/{self.num_repeats}",
        )
        return ", ".join(x.strip() for x in parts if x.strip() and x.strip() != "-")


@dataclass
class RunPlan:
    """The runs of one invocation, in order, and where their results go."""

    settings: RunSettings
    specs: list[RunSpec]
    backends: dict[str, Backend]  # name -> the backend that runs its specs
    workload: Workload  # the first load point's: the table's and the JSON's
    csv_path: Path  # the JSON goes beside it
    config: dict[str, object]  # the JSON's `config`: every option, and what the plan resolved
    percentiles: Sequence[float]  # the latency percentiles every row stores
    goodput: Mapping[str, float] | None
    label: str = ""
    command: str = ""
    resume: bool = False
    quiet: bool = False
    format: str = "text"  # the table: text | markdown | json (report/show.py)
    executor: ExecutorChoice | None = None  # --executor (perf/grid/executor.py; None: the plan's default)

    @property
    def run_options(self) -> dict[str, object]:
        """What shaped the runs without defining their configuration (a row's `run_options`)."""
        opts: dict[str, object] = {"warmup": self.settings.warmup, "cpu_threads": self.settings.cpu_threads}
        if self.settings.device.simulated:  # its numbers are this cost model's (the device column names the GPU)
            opts["cost_model"] = COST_MODEL_VERSION
        return opts

    def describe(self) -> str:
        """The plan as `--dry-run` prints it: the workload, then one line per run."""
        lines = [
            f"workload {self.workload.name}: {len(self.workload)} requests; {len(self.specs)} run(s); "
            f"results to {self.csv_path}"
        ]
        lines += [f"  {spec.describe()}" for spec in self.specs]
        return "\n".join(lines)
