"""The `Backend` base every perf backend implements, the `RunResult` it returns, the typed arguments it takes
(`BackendArgs`), and the registry by name.

A backend is a class with `run(spec, progress) -> RunResult`, registered with `Backend.register(name, kind, args)` (as
GuideLLM's backends register with their own argument classes): the registry maps its name to (its class, its
argument class), and `cbbench perf --backend NAME` (kinds "engine" and "server") and `--peers NAME` (kind "peer")
find it here. Its argument class, declared beside it in its module, is what it takes from the command line beyond
the plan's shared `RunSettings` (openai.py's `HttpArgs`); a backend that takes nothing of its own keeps the default,
`BackendArgs`. The options (plan/options.py) stand below every backend and name none: `Backend.create` makes a
backend's arguments from them as the plan is built. Adding a backend is one new module in backends/ that declares
and registers its class (and its arguments, if it has any), plus its import in backends/registry.py. What each kind
means to the plan:
- "engine": in process, swept over batching modes x engine knob sets; the peers may run beside it;
- "server": a server reached over HTTP; its knobs and modes are its own, so one run per load point;
- "peer": another engine on refengine's weights, run beside an "engine" backend (`--peers`).
Replay rules the same for every backend, so the rows compare: greedy, `ignore_eos`, each request generating its own
`output_len`; a multi-turn workload's turn sent after the previous answer, with the history as prefix
(`conversations.py`); a warm-up of short synthetic requests (`warmup_prompts`) first, left out of every record and step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, Self, TypeVar

import numpy as np

from cbbench.perf.backends.conversations import conversation_metrics, conversation_note
from cbbench.perf.client_lag import client_metrics
from cbbench.perf.knobs import EngineKnobs
from cbbench.perf.metrics import compute_metrics
from cbbench.perf.records import RequestRecord, StepRecord
from cbbench.perf.steady_state import steady_metrics

if TYPE_CHECKING:
    from cbbench.perf.plan.options import BackendOptions
    from cbbench.perf.plan.spec import RunSettings, RunSpec

# Synthetic warm-up prompts: short, and drawn far from the workloads' token ids so they never seed the prefix cache
WARMUP_PROMPT_LEN = 16
WARMUP_OUTPUT_LEN = 4
_WARMUP_TOKEN_RANGE = (50_000, 60_000)
KINDS = ("engine", "server", "peer")


class ProgressFn(Protocol):
    """Called with the number of requests that finished since the last call and, where the backend has them, their
    records: the progress line shows the run's tok/s and TTFT p50 so far from them. A backend first calls it with
    0 and no records when the measured run starts (engine built and warmed up), so that the run's elapsed time
    leaves those out, as its duration does."""

    def __call__(self, n: int, records: Sequence[RequestRecord] = ..., /) -> None: ...


@dataclass
class RunResult:
    """One measured run of one configuration (`error` set, and nothing else, when it could not run)."""

    engine: str  # the backend's name: "refengine" | "hf-static" | "hf-cb" | "openai" ...
    batching: str
    # the knobs that define this configuration, as the engine resolved them (CSV config columns); the step metrics
    # divide by its slots, token budget and KV blocks, stored here once
    knobs: EngineKnobs
    records: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)  # empty where the engine's steps cannot be seen
    duration: float = math.nan
    error: str | None = None

    def metrics(self, *, metric_percentiles: Sequence[float], goodput: Mapping[str, float] | None) -> dict[str, Any]:
        m = compute_metrics(
            self.records,
            self.duration,
            steps=self.steps,
            max_num_seqs=self.knobs.max_num_seqs,
            max_num_batched_tokens=self.knobs.max_num_batched_tokens,
            num_gpu_blocks=self.knobs.num_gpu_blocks,
            metric_percentiles=metric_percentiles,
            goodput=goodput,
        )
        # the client's report on itself (NaN in process) and the steady-state window's figures
        return {
            **m,
            **client_metrics(self.records),
            **steady_metrics(self.records),
            **conversation_metrics(self.records),
        }


@dataclass(frozen=True)
class BackendArgs:
    """What a backend takes from the command line beyond the plan's `RunSettings`, typed. A backend module declares
    its own subclass beside its class and registers the two together (`Backend.register(..., args=...)`); this base
    takes nothing, the arguments of a backend that needs none."""

    @classmethod
    def of(cls, options: BackendOptions) -> Self:
        """The arguments from the backend options as given (plan/options.py)."""
        return cls()


NO_ARGS = BackendArgs()


class Registered(NamedTuple):
    """A registered backend: its class and its argument class."""

    backend: type[Backend]
    args: type[BackendArgs]


B = TypeVar("B", bound="Backend")


class Backend:
    """What drives one run of a plan. Subclasses set `name` and `kind` through `Backend.register` and implement
    `run`; the constructor takes the plan's `RunSettings` and the backend's own arguments, and raises ValueError for
    settings it cannot serve (so a bad option fails while the plan is built, before anything runs)."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "engine"
    _registry: ClassVar[dict[str, Registered]] = {}

    def __init__(self, settings: RunSettings, args: BackendArgs = NO_ARGS) -> None:
        self.settings = settings
        self.args = args

    @classmethod
    def register(
        cls, name: str, kind: str = "engine", args: type[BackendArgs] = BackendArgs
    ) -> Callable[[type[B]], type[B]]:
        """Class decorator: `@Backend.register("openai", kind="server", args=HttpArgs)`."""
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")

        def add(backend: type[B]) -> type[B]:
            backend.name, backend.kind = name, kind
            cls._registry[name] = Registered(backend, args)
            return backend

        return add

    @classmethod
    def names(cls, *kinds: str) -> list[str]:
        """The registered names of these kinds, in registration order."""
        return [n for n, r in cls._registry.items() if r.backend.kind in kinds]

    @classmethod
    def get(cls, name: str) -> type[Backend]:
        return cls._registry[name].backend

    @classmethod
    def create(cls, name: str, settings: RunSettings, options: BackendOptions) -> Backend:
        """The backend registered as `name`, made for `settings` with its own arguments taken from `options`."""
        backend, args = cls._registry[name]
        return backend(settings, args.of(options))

    def prepare(self) -> None:
        """Called once before the plan's first run, in this process (a server backend asks its server what it
        offers here); a ValueError refuses the whole plan before anything runs. Nothing by default."""

    def run(self, spec: RunSpec, progress: ProgressFn | None = None) -> RunResult:
        raise NotImplementedError

    def row_config(self, result: RunResult) -> tuple[dict[str, Any], str]:
        """The CSV's configuration cells of a result (knobs and dtype) and its device column."""
        return {**result.knobs.given(), "dtype": self.settings.dtype_name}, self.settings.device.name

    def notes(self, key: tuple[str, str, str], result: RunResult) -> list[str]:
        """Lines printed under the table about this run (failed requests, a multi-turn run's turn metrics, ...)."""
        return conversation_note(f"{key[0]} {key[1]} {key[2]}".strip(), conversation_metrics(result.records))


def warmup_prompts(n: int, seed: int, vocab_size: int | None = None) -> list[list[int]]:
    """Prompts of 1-4 x WARMUP_PROMPT_LEN tokens: with staggered output lengths (WARMUP_OUTPUT_LEN + i) the warm-up
    meets every decode batch size from n down to 1 and several prefill shapes, so that the first measured run does
    not pay for first-use kernel selection that the runs after it are spared. With `vocab_size` (a model's, when known) every id is folded into it."""
    rng = np.random.default_rng(seed + 7919)
    prompts = [rng.integers(*_WARMUP_TOKEN_RANGE, size=WARMUP_PROMPT_LEN * (1 + i % 4)).tolist() for i in range(n)]
    return prompts if vocab_size is None else [[t % vocab_size for t in p] for p in prompts]


def warmup_lengths(n: int, seed: int) -> list[tuple[int, int]]:
    """(prompt_len, output_len) of each warm-up request, for the checks made before a sweep runs."""
    return [(len(p), WARMUP_OUTPUT_LEN + i) for i, p in enumerate(warmup_prompts(n, seed))]
