"""`--help` on a narrow terminal (issue 28: `COLUMNS=80 cbbench perf --help` cut option names and defaults): at 80
columns, and at the widest width that still draws option panels stacked, every command shows each option name and
each default whole, on one line, with no ellipsis; from STACKED_BELOW columns up, typer's table layout is kept."""

from __future__ import annotations

import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cbbench.perf import cli
from cbbench.perf.cli.help_layout import STACKED_BELOW

COMMANDS = ["", *sorted(get_command(cli.app).commands)]
NARROW = (80, STACKED_BELOW - 1)  # the width the issue names, and the widest stacked one
DEFAULT = re.compile(r"\[default: [^\]]*\]")


def _help(command: str, columns: int) -> str:
    res = CliRunner().invoke(cli.app, [*([command] if command else []), "--help"], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    return res.output


def _names(command: str) -> list[str]:
    group = get_command(cli.app)
    click_cmd = group.commands[command] if command else group
    params = [p for p in click_cmd.params if not getattr(p, "hidden", False)]
    return [o for p in params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]  # (not arguments)


@pytest.mark.parametrize("columns", NARROW)
@pytest.mark.parametrize("command", COMMANDS)
def test_narrow_help_keeps_every_name_and_default_whole(command: str, columns: int) -> None:
    out = _help(command, columns)
    assert "…" not in out, [line for line in out.splitlines() if "…" in line]
    assert max(len(line) for line in out.splitlines()) <= columns
    for name in _names(command):
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", out), name
    wide_defaults = DEFAULT.findall(_help(command, 200))
    for d in wide_defaults:  # each on one line: never cut, never wrapped inside
        assert any(d in line for line in out.splitlines()), d


def test_wide_help_keeps_the_table_layout() -> None:
    out = _help("perf", STACKED_BELOW)
    assert any(re.match(r"│ --seed +<int> +\[default: 0\]", line) for line in out.splitlines()), out
