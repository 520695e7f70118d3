"""A command's options, made from their declarations (plan/declared.py): one typer parameter per declared option.

`takes(options)` gives a typer command one parameter per option listed, in that order, each with the declaration's
type, default, help and spelling, and hands the command what it was given as one typed `Values`
(`values[RUN.warmup]`). The engine knobs are added beside them by knobs.engine_knob_options, from the engine's configs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

import typer

from cbbench.perf.plan.declared import Option, Values

R = TypeVar("R")


def typer_parameter(o: Option[Any]) -> inspect.Parameter:
    """The typer parameter of one declaration."""
    info = typer.Option(*o.flags, help=o.help, metavar=o.metavar)
    return inspect.Parameter(
        o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=Annotated[o.kind, info]
    )


def takes(options: Sequence[Option[Any]]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Decorator: the command takes `options` (after its `ctx`, before its other parameters) and receives their
    values as its keyword parameter `values`."""
    names = [o.name for o in options]
    if len(set(names)) != len(names):
        raise ValueError(f"an option is listed twice: {sorted(n for n in names if names.count(n) > 1)[0]}")

    def deco(fn: Callable[..., R]) -> Callable[..., R]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "values"]
        ctx = [p for p in own if p.name == "ctx"]
        rest = [p for p in own if p.name != "ctx"]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> R:  # (typer passes every option by keyword)
            values = Values({o.key: kwargs.pop(o.name) for o in options})
            return fn(*args, values=values, **kwargs)

        params = [*ctx, *(typer_parameter(o) for o in options), *rest]
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return wrapper

    return deco
