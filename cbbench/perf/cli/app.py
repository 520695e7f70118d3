"""The `cbbench` Typer app and how its commands fail: every failure is ONE line on stderr.

Usage errors (unknown option, bad integer) exit 2 from `OneLineErrorsTyper`; inside a command `one_line_errors`
turns bad input (CliError, ValueError, a missing or unwritable file) into exit 2, an interrupt into 130 and anything
else into a one-line internal error, exit 1 (CBBENCH_DEBUG=1 shows the traceback). `explicit_params` and
`command_line` tell what the user gave, for `perf --like` and the command recorded with every result.
"""

from __future__ import annotations

import functools
import importlib
import os
import shlex
import sys
import traceback
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from typer.models import CommandFunctionType

from cbbench.perf.cli.help_layout import fitted_help
from cbbench.perf.cli.wording import flag_wording

_exc = sys.modules[typer.BadParameter.__module__]
# typer 0.2x runs on its own copy of click (typer._click): the context of a running command is on that copy's stack
_click_globals = importlib.import_module(_exc.__name__.rpartition(".")[0] + ".globals")
_NO_ARGS_IS_HELP = getattr(_exc, "NoArgsIsHelpError", ())


class OneLineErrorsTyper(typer.Typer):
    """Usage errors (unknown option, bad integer) as one line on stderr, exit code 2, instead of a boxed panel; and
    every command built as `_Command` (flags show no type in --help)."""

    def command(  # (typer's own signature type: the decorator returns the command function it was given)
        self, *args: Any, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        kwargs.setdefault("cls", _Command)
        return super().command(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        command = typer.main.get_command(self)
        try:
            rv = command.main(*args, **{**kwargs, "standalone_mode": False})  # we print the errors, one line each
        except _NO_ARGS_IS_HELP as e:
            e.show()
            sys.exit(e.exit_code)
        except _exc.ClickException as e:
            err.print(f"cbbench: error: {e.format_message()}", markup=False)
            sys.exit(e.exit_code)
        except (typer.Abort, KeyboardInterrupt):
            err.print("cbbench: interrupted", markup=False)
            sys.exit(130)
        except Exception as e:  # noqa: BLE001 - a failure outside any command (building the app): still one line
            _internal_error("cbbench", e)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


class _FlagOption(typer.core.TyperOption):
    """An option whose --help row names no type when it is a flag: typer 0.2x labels every option with its type,
    flags too (`--help <bool>`, `--quiet/--no-quiet <bool>`), though a flag takes no value."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None if self.is_flag else super().display_type_rich(ctx)


class _PlainValue:
    """How a str, Path or bool parameter's value is coerced, instead of typer's: typer 0.2x builds a pydantic adapter
    per parameter, and importing pydantic for that is a large share of `compare`'s or `plot --help`'s start
    (docs/measurements.md).
    A command-line value is a str already, so turning it into a str or a Path cannot fail; a bool that is not one
    yet (from an environment variable) goes to typer's own coercion."""

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        many = param.multiple or param.nargs == -1
        if value is None:
            return () if many else None
        if many and isinstance(value, str):  # typer's own message for this
            raise typer.BadParameter("Value must be an iterable.", ctx=ctx, param=param)
        values = list(value) if many else [value]
        if self.kind is bool and not all(isinstance(v, bool) for v in values):
            from typer._coercion import build_runtime_param

            return build_runtime_param(param.type_descriptor).coerce(value, param=param, ctx=ctx)
        out = [self.kind(v) for v in values]
        return out if many else out[0]


_CHECKS = ("exists", "writable", "resolve_path", "allow_dash", "path_type", "parser", "click_type")


def _plain_coercion(p: Any) -> _PlainValue | None:
    """`_PlainValue` for a parameter typed str, Path, bool or a list of them, with no check attached; None otherwise
    (or when typer's internals are not the ones this was written against: typer then coerces as it always did)."""
    desc = getattr(p, "type_descriptor", None)
    if desc is None or getattr(p, "_runtime_param", False) is not None or desc.file_annotation is not None:
        return None
    info, ann = desc.parameter_info, desc.annotation
    if typing.get_origin(ann) is list and len(typing.get_args(ann)) == 1:
        ann = typing.get_args(ann)[0]
    if ann not in (str, Path, bool) or any(getattr(info, name, None) for name in _CHECKS):
        return None
    return _PlainValue(ann)


def _flags_untyped(params: list[Any]) -> list[Any]:
    for p in params:
        if type(p) is typer.core.TyperOption and p.is_flag:
            p.__class__ = _FlagOption  # a subclass that adds no state: only how its help row reads changes
        if (plain := _plain_coercion(p)) is not None:
            p._runtime_param = plain  # typer's own cache of it: its `get_runtime_param` returns this
    return params


class _Command(typer.core.TyperCommand):
    """Every cbbench command: its flags' --help rows name no type (`_FlagOption`), and a narrow terminal's --help
    keeps every name and default whole (help_layout.py)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_untyped(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with fitted_help():
            super().format_help(ctx, formatter)


class _Group(typer.core.TyperGroup):
    """The `cbbench` group: its own --help row names no type either, and fits a narrow terminal as well."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_untyped(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with fitted_help():
            super().format_help(ctx, formatter)


app = OneLineErrorsTyper(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="cbbench: continuous-batching benchmark and conformance harness.",
)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class CliError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


DEBUG_ENV = "CBBENCH_DEBUG"  # set to 1 to see the traceback of an internal error


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _internal_error(prog: str, e: BaseException) -> None:
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exception(e)
    err.print(
        f"{prog}: internal error: {type(e).__name__}: {_first_line(e)} (set {DEBUG_ENV}=1 for the traceback)",
        markup=False,
    )


def _cli_message(e: BaseException) -> str:
    """The error's first line, as the command line words it (`flag_wording`)."""
    ctx: Any = _click_globals.get_current_context(silent=True)
    if isinstance(e, OSError):
        from cbbench.perf.results.files import file_error_line  # (the results files' module: not at --help)

        line = file_error_line(e)
    else:
        line = _first_line(e)
    return flag_wording(line, ctx.command.params) if ctx is not None else line


def one_line_errors(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Every way a command can fail ends with one line on stderr: bad input (CliError, ValueError, a missing or
    unwritable file) exits 2, an interrupt 130, anything else is an internal error and exits 1."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (typer.Exit, _exc.ClickException):
                raise
            except (
                CliError,
                ValueError,
                FileNotFoundError,
                PermissionError,
                IsADirectoryError,
                NotADirectoryError,
            ) as e:
                err.print(f"cbbench {name}: error: {_cli_message(e)}", markup=False)
                raise typer.Exit(2) from None
            except (typer.Abort, KeyboardInterrupt) as e:
                why = str(e).strip()  # perf says where the finished runs are
                err.print(f"cbbench {name}: interrupted" + (f": {why}" if why else ""), markup=False)
                raise typer.Exit(130) from None
            except Exception as e:  # noqa: BLE001 - a bug: one line, not a double traceback
                _internal_error(f"cbbench {name}", e)
                raise typer.Exit(1) from None

        return inner

    return wrap


Opt = typer.Option


def explicit_params(ctx: typer.Context) -> list[str]:
    """The parameters given on the command line (or by environment), not left at their defaults."""

    def given(name: str) -> bool:
        src = ctx.get_parameter_source(name)
        return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")

    return [p.name for p in ctx.command.params if p.name and given(p.name)] + (["goodput"] if ctx.args else [])


def command_line(ctx: typer.Context) -> str:
    """`cbbench perf` with every option that was given, canonically spelled: what a result records so that a
    reader (or `compare`'s message) can see how it was made."""
    parts = ["cbbench", ctx.info_name or "perf"]
    given = set(explicit_params(ctx))
    for p in ctx.command.params:
        if p.name not in given or not getattr(p, "opts", None):
            continue
        value = ctx.params.get(p.name)
        if getattr(p, "is_flag", False) or isinstance(value, bool):
            parts.append(p.opts[0] if value else (p.secondary_opts or [p.opts[0]])[0])
        elif isinstance(value, (list, tuple)):
            for v in value:
                parts += [p.opts[0], str(v)]
        elif value is not None:
            parts += [p.opts[0], str(value)]
    parts += list(ctx.args)
    return shlex.join(parts)
