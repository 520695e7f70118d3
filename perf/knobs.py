"""The engine knobs of the command line, generated from the config dataclasses in one place.

Every field of `SchedulerConfig` and of `EngineConfig` that a user may set becomes a `Knob` (name, type, choices,
default, help); `engine_knob_options` turns them into typer options of a command, so `cbbench perf` (as comma lists,
for sweeps) and `cbbench serve` (single typed values) never repeat a knob list. A field added to either config shows
up as an option without touching the CLI; its help comes from the field's `metadata={"help": ...}` when it has
one, else from `_HELP` here, else a generic line. Choices come from the constants the configs validate against.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, cast

import typer

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
    from refengine import config

    return {
        "batching": config.BATCHING_MODES,
        "preemption_mode": config.PREEMPTION_MODES,
        "policy": config.POLICIES,
        "attention_backend": config.ATTENTION_BACKENDS,
    }


@dataclass(frozen=True)
class Knob:
    """One engine knob: a config field as the command line sees it."""

    name: str
    type: type  # int, float, bool or str (Optional[...] unwrapped)
    default: Any  # the config's default (None: the engine decides)
    help: str
    choices: tuple[str, ...] | None = None
    source: str = "SchedulerConfig"  # or "EngineConfig"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text: Any) -> Any:
        """One value from its command-line text; ValueError naming the knob."""
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

    def parse_list(self, text: Any) -> list[Any]:
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


def _base_type(hint: Any) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
    if hint not in (int, float, bool, str):
        raise TypeError(f"config field of type {hint!r} cannot be a command-line knob")
    return cast(type, hint)  # one of the four, checked above


@functools.lru_cache(maxsize=1)
def engine_knobs() -> tuple[Knob, ...]:
    """Every settable engine knob: SchedulerConfig's fields, then EngineConfig's (field order)."""
    from refengine.config import EngineConfig, SchedulerConfig

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


def _option(k: Knob, sweep: bool, help_override: str | None) -> tuple[Any, Any]:
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

    The command takes a `knobs: dict` parameter (hidden from the CLI) and receives {knob name: value} for the knobs
    given on the command line (None for those left out): comma-list strings when `sweep`, else typed values
    (parse them with `parse_knobs` / `Knob.parse`).
    """
    excluded = set(exclude)
    overrides = dict(help or {})

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
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
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            knobs = {n: kwargs.pop(n, None) for n in names if n not in taken}
            return fn(*args, knobs=knobs, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return wrapper

    return deco


def parse_knobs(raw: Mapping[str, Any]) -> dict[str, list[Any]]:
    """{name: comma list | value | None} -> {name: [values]} for the knobs that were given."""
    out: dict[str, list[Any]] = {}
    for name, value in raw.items():
        if value is None:
            continue
        out[name] = knob(name).parse_list(value)
    return out


def split_knobs(knobs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(SchedulerConfig fields, EngineConfig fields) of one knob set."""
    src = {k.name: k.source for k in engine_knobs()}
    sched = {k: v for k, v in knobs.items() if src.get(k) == "SchedulerConfig"}
    return sched, {k: v for k, v in knobs.items() if k not in sched}


def validate_knobs(knobs: Mapping[str, Any], **scheduler_extra: Any) -> None:
    """Build the configs of one knob set, so a bad value fails with the engine's own ValueError (no model is
    loaded)."""
    from refengine.config import EngineConfig, SchedulerConfig

    sched, eng = split_knobs({k: v for k, v in knobs.items() if v is not None})
    SchedulerConfig(**scheduler_extra, **sched)
    EngineConfig(**eng)
