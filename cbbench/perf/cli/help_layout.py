"""`--help` on a narrow terminal: every option name, type and default whole.

typer lays a command's options out as a table (names | negative names | type | help). When the terminal is
narrower than the names and types of the longest options need, rich shrinks every column and cuts names and
defaults with an ellipsis (`--metric-percentil…`, `http://127.0.0.1:8…` at 80 columns). Below STACKED_BELOW
columns each option is drawn as two rows instead: its names and type on the first, its help (with its default)
indented under them, wrapped at spaces. The usage line, the description and the command list are typer's own at
every width, and so is the whole page at STACKED_BELOW columns or more (the pinned --help snapshots, at 200).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.text import Text
from typer import rich_utils
from typer.core import TyperArgument

# The widest table layout that still cuts a name: `perf` and `serve` at 100 columns (6 and 3 names cut);
# at 120 no command cuts one. perf/tests/test_cli_help.py checks every command at 80 and at this width.
STACKED_BELOW = 120
HELP_INDENT = 4  # the help under an option's names


def _names(param: Any) -> str:
    """An option's names as typed (`--enable-prefix-caching / --no-enable-prefix-caching`), an argument's metavar."""
    if isinstance(param, TyperArgument):
        name = str(param.display_name_raw)
        return name + ("..." if param.metavar is None and param.nargs != 1 else "")
    names = ", ".join(param.opts)
    return names + (" / " + ", ".join(param.secondary_opts) if param.secondary_opts else "")


def _head(param: Any, ctx: Any) -> Text:
    head = rich_utils.highlighter(Text(_names(param)))
    kind = param.display_type_rich(ctx=ctx)
    if kind:
        head.append(" ")
        head.append_text(rich_utils.types_highlighter(Text(kind, style=rich_utils.STYLE_TYPES)))
    return head


def _stacked_panel(*, name: str, params: Sequence[Any], ctx: Any, markup_mode: Any, console: Console) -> None:
    """typer's `_print_options_panel`, one option after another: names and type, then the help under them."""
    rows: list[RenderableType] = []
    for param in params:
        rows.append(_head(param, ctx))
        help_ = rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
        rows.append(Padding(help_, (0, 0, 0, HELP_INDENT)))
    if rows:
        console.print(
            Panel(
                Group(*rows),
                border_style=rich_utils.STYLE_OPTIONS_PANEL_BORDER,
                title=name,
                title_align=rich_utils.ALIGN_OPTIONS_PANEL,
            )
        )


def help_width() -> int:
    """The width `--help` is drawn at: typer's console's (COLUMNS, else the terminal, else 80)."""
    return rich_utils._get_rich_console().width


@contextlib.contextmanager
def fitted_help() -> Iterator[None]:
    """While inside, typer draws option panels stacked if the help is narrower than STACKED_BELOW columns."""
    if help_width() >= STACKED_BELOW:
        yield
        return
    table = rich_utils._print_options_panel
    rich_utils._print_options_panel = _stacked_panel  # (typer looks the function up when it draws each panel)
    try:
        yield
    finally:
        rich_utils._print_options_panel = table
