"""The engine knobs of the command line, generated from the config dataclasses in one place.

Every field of `SchedulerConfig` and of `EngineConfig` that a user may set becomes a `Knob` (name, type, choices,
default, help); `engine_knob_options` turns them into typer options of a command, so `cbbench perf` (as comma lists,
for sweeps) and `cbbench serve` (single typed values) never repeat a knob list. A field added to either config shows
up as an option without touching the CLI; its help comes from the field's `metadata={"help": ...}` when it has
one, else from `_HELP` here, else a generic line. Choices come from the constants the configs validate against.

What a command receives is typed: `EngineKnobs`, one configuration's knobs as fields named as the configs name them
(perf/tests/test_knobs.py holds the two to the same names and types), and `KnobGrid`, a sweep's knobs as one axis
of values per knob given. A configuration's knobs become refengine's `EngineArgs` in one place,
`EngineKnobs.engine_args`, which builds the engine's configs and so checks every value once, with the engine's own
ValueError; the plan carries those arguments to the run's engine (`LLMEngine.from_engine_args`) as they are.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, cast

import typer

from refengine import config as _config
from refengine.config import EngineConfig, SchedulerConfig
from refengine.engine.engine_args import EngineArgs

KnobValue = int | float | bool | str

# Fields that are not engine knobs of a command: the model and device are the command's own options, and
# `scheduler` / SchedulerConfig.max_model_len are plumbing (the engine fills max_model_len from EngineConfig).
# stats_log_size is the runner's business: perf keeps every step's stats.
_NOT_KNOBS = {"model", "device", "dtype", "seed", "scheduler", "stats_log_size"}
_SCHEDULER_PLUMBING = {"max_model_len"}

_HELP = {
    "max_num_batched_tokens": "token budget per step",
    "max_num_seqs": "most requests in a batch (slots)",
    "block_size": "tokens per KV block",
    "num_gpu_blocks": "KV blocks on the device (default: sized from the KV memory)",
    "num_cpu_blocks": "host blocks for swap",
    "enable_chunked_prefill": "split a prompt larger than the budget left across steps",
    "long_prefill_token_threshold": "most prefill tokens of one request per step (0: no cap)",
    "enable_prefix_caching": "reuse cached full blocks of a shared prefix",
    "preemption_mode": "what happens to a victim when KV runs out",
    "policy": "waiting-queue order",
    "batching": "batching mode",
    "priority_preemption": "a waiting request of more urgent priority may preempt (needs --policy priority)",
    "attention_backend": "attention kernels (default: torch on CPU, triton on CUDA)",
    "max_model_len": "longest prompt + output (default: the model's context)",
    "kv_cache_memory_gb": "KV cache size that num_gpu_blocks is derived from",
    "async_scheduling": (
        "schedule step N+1 while step N's forward runs (vLLM's async scheduling; default: on with a CUDA device, off "
        "elsewhere)"
    ),
    "enforce_eager": "never replay CUDA graphs (they are only used on CUDA with the triton backend)",
}


def _choices() -> dict[str, tuple[str, ...]]:
    return {
        "batching": _config.BATCHING_MODES,
        "preemption_mode": _config.PREEMPTION_MODES,
        "policy": _config.POLICIES,
        "attention_backend": _config.ATTENTION_BACKENDS,
    }


@dataclass(frozen=True)
class Knob:
    """One engine knob: a config field as the command line sees it."""

    name: str
    type: type  # int, float, bool or str (Optional[...] unwrapped)
    default: KnobValue | None  # the config's default (None: the engine decides)
    help: str
    choices: tuple[str, ...] | None = None
    source: str = "SchedulerConfig"  # or "EngineConfig"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str | KnobValue) -> KnobValue:
        """One value from its command-line text (a value already typed passes); ValueError naming the knob."""
        if not isinstance(text, str):
            return text
        t = text.strip()
        try:
            if self.type is bool:
                low = t.lower()
                if low not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                return low in ("true", "1", "yes")
            if self.type is int:
                return int(t)
            if self.type is float:
                v = float(t)
                if math.isnan(v):
                    raise ValueError
                return v
        except ValueError:
            kind = {int: "an integer", float: "a number", bool: "true or false"}[self.type]
            raise ValueError(f"{self.name}: expected {kind}, got {t!r}") from None
        if self.choices is not None and t not in self.choices:
            raise ValueError(f"{self.name} must be one of {self.choices}, got {t!r}")
        return t

    def parse_list(self, text: str | KnobValue) -> list[KnobValue]:
        """A comma list (a sweep) of values; a bool flag is one value."""
        if not isinstance(text, str):
            return [text]
        parts = [x for x in text.split(",") if x.strip()]
        if not parts:
            raise ValueError(f"{self.name}: empty list")
        try:
            return [self.parse(x) for x in parts]
        except ValueError as e:
            if self.type in (int, float) and "expected" in str(e):
                kind = "integers" if self.type is int else "numbers"
                raise ValueError(f"{self.name}: expected a comma list of {kind}, got {text!r}") from None
            raise


def _base_type(hint: object) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
    if hint not in (int, float, bool, str):
        raise TypeError(f"config field of type {hint!r} cannot be a command-line knob")
    return cast(type, hint)  # one of the four, checked above


@functools.lru_cache(maxsize=1)
def engine_knobs() -> tuple[Knob, ...]:
    """Every settable engine knob: SchedulerConfig's fields, then EngineConfig's (field order)."""
    choices = _choices()
    out: dict[str, Knob] = {}
    for cls, skip in ((SchedulerConfig, _SCHEDULER_PLUMBING), (EngineConfig, set())):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in _NOT_KNOBS or f.name in skip or f.name in out or not f.init:
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            help_text = f.metadata.get("help") or _HELP.get(f.name) or f"{cls.__name__}.{f.name}"
            out[f.name] = Knob(
                f.name,
                _base_type(hints[f.name]),
                default,
                help_text,
                tuple(f.metadata.get("choices") or choices.get(f.name) or ()) or None,
                cls.__name__,
            )
    return tuple(out.values())


def knob(name: str) -> Knob:
    for k in engine_knobs():
        if k.name == name:
            return k
    raise ValueError(f"unknown engine knob {name!r}")


def knob_names(exclude: Iterable[str] = ()) -> tuple[str, ...]:
    ex = set(exclude)
    return tuple(k.name for k in engine_knobs() if k.name not in ex)


def list_metavar(item: str) -> str:
    """How --help shows an option that takes a comma list (typer would say <str>)."""
    return f"<{item},...>"


def _option(k: Knob, sweep: bool, help_override: str | None) -> tuple[object, None]:
    """(annotation, default) of the typer parameter for one knob."""
    help_text = help_override or k.help
    if k.choices:
        help_text += f" ({' | '.join(k.choices)})"
    if k.default is not None and "default:" not in help_text:  # (num_gpu_blocks: the engine sizes it instead)
        help_text += f"; engine default {k.default}"
    if k.type is bool:
        decl = f"{k.flag}/--no-{k.flag[2:]}"
        return Annotated[bool | None, typer.Option(decl, help=help_text, show_default=False)], None
    if sweep:
        return Annotated[
            str | None,
            typer.Option(
                k.flag,
                help=f"{help_text}; a comma list sweeps",
                metavar=list_metavar(k.type.__name__),
                show_default=False,
            ),
        ], None
    return Annotated[k.type | None, typer.Option(k.flag, help=help_text, show_default=False)], None


def engine_knob_options(
    *, sweep: bool, exclude: Iterable[str] = (), help: Mapping[str, str] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: add one option per engine knob to a typer command.

    The command takes a `knobs` parameter (hidden from the CLI): a `KnobGrid` of the knobs given as comma lists
    when `sweep`, else the `EngineKnobs` given, each parsed as its knob's type (ValueError naming the knob).
    """
    excluded = set(exclude)
    overrides = dict(help or {})

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:  # (any typer command function)
        names = [k.name for k in engine_knobs() if k.name not in excluded]
        sig = inspect.signature(fn, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name != "knobs"]
        taken = {p.name for p in params}
        for k in engine_knobs():
            if k.name in excluded or k.name in taken:
                continue
            ann, default = _option(k, sweep, overrides.get(k.name))
            params.append(inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:  # (typer passes every option by keyword)
            given = {n: kwargs.pop(n, None) for n in names if n not in taken}
            knobs = KnobGrid.parse(given) if sweep else EngineKnobs.parse(given)
            return fn(*args, knobs=knobs, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return wrapper

    return deco


@dataclass(frozen=True)
class EngineKnobs:
    """One configuration's engine knobs, each a field of SchedulerConfig or EngineConfig under the config's own name
    and type (perf/tests/test_knobs.py checks the two agree); None leaves a knob to the engine's default."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    enable_chunked_prefill: bool | None = None
    long_prefill_token_threshold: int | None = None
    enable_prefix_caching: bool | None = None
    preemption_mode: str | None = None
    policy: str | None = None
    batching: str | None = None
    priority_preemption: bool | None = None
    async_scheduling: bool | None = None
    attention_backend: str | None = None
    max_model_len: int | None = None
    kv_cache_memory_gb: float | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool | None = None
    tensor_parallel_size: int | None = None
    # the order the knobs were given in (a sweep's axes, the CPU's default last): `given` lists them so, then the rest
    order: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)

    @classmethod
    def parse(cls, given: Mapping[str, str | KnobValue | None]) -> EngineKnobs:
        """The knobs of {knob name: text or value}, each parsed as its knob's type (ValueError naming it)."""
        return cls.of({name: knob(name).parse(v) for name, v in given.items() if v is not None})

    @classmethod
    def of(cls, values: Mapping[str, KnobValue]) -> EngineKnobs:
        """The knobs of {knob name: typed value} (a results row's config columns, a sweep's point)."""
        return cls(**values, order=tuple(values))  # type: ignore[arg-type]  # (names: the constructor's; types: the configs')

    def given(self) -> dict[str, KnobValue]:
        """{name: value} of the knobs set: those of `order` in it, the others in the configs' field order."""
        names = [*self.order, *(n for n in knob_names() if n not in self.order)]
        return {n: v for n in names if (v := getattr(self, n)) is not None}

    def engine_args(self, *, model: str, device: str, dtype: str | None, seed: int, batching: str) -> EngineArgs:
        """refengine's arguments of one run of these knobs (those not set are left to the engine's defaults): making
        them builds the engine's configs, so a bad value fails here with the engine's own ValueError, before a model
        is loaded; `LLMEngine.from_engine_args` takes them as they are. stats_log_size=None: the run keeps every
        step's stats (the engine keeps only the newest by default)."""
        return EngineArgs.from_kwargs(
            model, device=device, dtype=dtype, seed=seed, batching=batching, stats_log_size=None, **self.given()
        )

    def validate(self, batching: str | None = None) -> None:
        """Build the configs of these knobs (`batching` for the run's mode) as the engine does, so a bad value fails
        with the engine's own ValueError; no model is loaded (`cbbench serve` checks its knobs so, before the
        server starts)."""
        knobs: dict[str, Any] = {**self.given(), **({} if batching is None else {"batching": batching})}
        EngineArgs.from_kwargs(**knobs)


@dataclass(frozen=True)
class KnobAxis:
    """The values one knob takes in a sweep (a comma list; a bool flag is one value)."""

    name: str
    values: tuple[KnobValue, ...]
    text: str | bool  # as given on the command line: what the JSON's config records

    @classmethod
    def parse(cls, name: str, text: str | bool) -> KnobAxis:
        return cls(name, tuple(knob(name).parse_list(text)), text)

    @classmethod
    def of(cls, name: str, values: Iterable[KnobValue]) -> KnobAxis:
        vals = tuple(values)
        return cls(name, vals, ",".join(map(str, vals)))


@dataclass(frozen=True)
class KnobGrid:
    """The engine knobs of a sweep: one axis per knob given; every configuration is a point of their product, and a
    knob not given takes the engine's default."""

    axes: tuple[KnobAxis, ...] = ()

    @classmethod
    def parse(cls, given: Mapping[str, str | bool | None]) -> KnobGrid:
        """The grid of {knob name: comma list, bool or None (not given)}; ValueError naming a bad knob."""
        return cls(tuple(KnobAxis.parse(name, text) for name, text in given.items() if text is not None))

    def axis(self, name: str) -> KnobAxis | None:
        return next((a for a in self.axes if a.name == name), None)

    def with_axis(self, axis: KnobAxis) -> KnobGrid:
        """This grid with `axis` in place of its knob's axis, or added where its knob comes in the configs' field
        order (the order the command line gives the axes in, which the order of the runs follows)."""
        axes = {a.name: a for a in self.axes} | {axis.name: axis}
        return KnobGrid(tuple(axes[name] for name in knob_names() if name in axes))

    def configurations(self) -> list[EngineKnobs]:
        """Every point of the grid, the first axis slowest ([EngineKnobs()] for an empty grid), its knobs in the
        axes' order."""
        names = [a.name for a in self.axes]
        return [EngineKnobs.of(dict(zip(names, combo))) for combo in itertools.product(*(a.values for a in self.axes))]

    def record(self, exclude: Iterable[str] = ()) -> dict[str, str | bool | None]:
        """{knob name: as given, or None} for every knob: what the JSON's config records."""
        return {n: (a.text if (a := self.axis(n)) is not None else None) for n in knob_names(exclude)}


def parse_knobs(raw: Mapping[str, str | KnobValue | None]) -> dict[str, list[KnobValue]]:
    """{name: comma list | value | None} -> {name: [values]} for the knobs that were given."""
    return {name: knob(name).parse_list(value) for name, value in raw.items() if value is not None}


def validate_knobs(knobs: Mapping[str, KnobValue | None], *, batching: str | None = None) -> None:
    """Build the configs of one knob set, so a bad value fails with the engine's own ValueError (no model is
    loaded)."""
    EngineKnobs.of({k: v for k, v in knobs.items() if v is not None}).validate(batching)


NO_KNOBS = EngineKnobs()  # every knob at the engine's default (frozen: safe to share as a default)
NO_GRID = KnobGrid()  # a sweep with no knob given
