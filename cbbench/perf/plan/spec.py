"""What the runs of one `cbbench perf` invocation are made of, below the backends that run them.

`RunSettings` is what every run shares (model, device, dtype, seed, warm-up, tokenizer, the server's address);
`RunSpec` is one run (workload, backend, batching mode, knobs, load point, repeat), what a backend's `run` takes.
`RunPlan` (grid/build.py) holds the specs in the order they run, the backends that run them, and where the results
go; `build_plan` makes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from cbbench.perf.knobs import EngineKnobs, KnobGrid
from cbbench.perf.plan.load import LoadPoint
from cbbench.perf.plan.options import knob_label
from cbbench.perf.results.writer import plan_id
from refengine.sim.sim_device import DeviceSpec

if TYPE_CHECKING:
    from cbbench.workloads.workload import Workload
    from refengine.engine.engine_args import EngineArgs
    from refengine.tokenizer import Tokenizer


T = TypeVar("T")


def interleaved(configs: Sequence[T], repeats: int) -> list[tuple[int, T]]:
    """(repeat, configuration) in the order a plan runs them: every configuration once per repeat, the repeats
    alternately forward and backward (A B C, C B A, A B C, ...): the gate's ABBA order (gate/arms.py) for any number
    of configurations. Within each pair of repeats every configuration holds the same mean position, so a machine
    whose speed drifts (a load trend, a neighbour starting) shifts each configuration's pair of runs alike and a ratio
    between two of them keeps it out; run configuration by configuration, one of them would take the whole drift."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    return [(rep, c) for rep in range(repeats) for c in (configs if rep % 2 == 0 else configs[::-1])]


@dataclass
class RunSettings:
    """What every run of a plan shares. `tokenizer` and `dtype_name` are filled in as the plan is built; what one
    backend alone takes is its own arguments' (backends/backend.py: `BackendArgs`)."""

    model: str
    device: DeviceSpec
    dtype: str | None  # as given (None: the device's default)
    seed: int
    warmup: int
    cpu_threads: int | None
    repeats: int = 1
    base_url: str | None = None  # the server's address (a server backend's runs go there; run_plan checks it answers)
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
    # an in-process engine's arguments, as the plan made (and so checked) them (None for a server or a peer):
    # `LLMEngine.from_engine_args` takes them as they are
    engine_args: EngineArgs | None = field(default=None, compare=False)

    @property
    def plan_id(self) -> str:
        """What names this run in a results file before it runs (`--resume` skips the ids it holds)."""
        knobs: dict[str, object] = {**self.knobs.given(), **dict.fromkeys(self.unset_in_id)}
        return plan_id(self.backend, self.batching, knobs, self.load_label, self.repeat)

    def label_of(self, resolved: EngineKnobs) -> str:
        """The run's label in the table and the JSON, from its result's knobs (as the engine resolved them)."""
        parts = (knob_label(resolved.given(), set(self.varying)), self.load_label)
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
