"""Every `cbbench` command's `--help`, byte for byte, against the snapshots in fixtures/help/: a refactor of the CLI
keeps what users read. A deliberate change of an option or its help text is made by regenerating the snapshots
(`python perf/tests/test_help_pinned.py`) and reviewing their diff."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cbbench.perf import cli

FIXTURES = Path(__file__).parent / "fixtures" / "help"
WIDE = {"COLUMNS": "200", "NO_COLOR": "1"}  # a fixed width, so the snapshot does not depend on the terminal
COMMANDS = sorted(get_command(cli.app).commands)


def _help(*args: str) -> str:
    res = CliRunner().invoke(cli.app, [*args, "--help"], env=WIDE)
    assert res.exit_code == 0, res.output
    return res.output


def _snapshot_name(command: str) -> str:
    return f"{command or 'cbbench'}.txt"


def test_every_command_has_a_snapshot() -> None:
    have = sorted(p.name for p in FIXTURES.glob("*.txt"))
    assert have == sorted(_snapshot_name(c) for c in ["", *COMMANDS])


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_matches_snapshot(command: str) -> None:
    want = (FIXTURES / _snapshot_name(command)).read_text()
    assert _help(*([command] if command else [])) == want


if __name__ == "__main__":  # regenerate the snapshots
    for c in ["", *COMMANDS]:
        (FIXTURES / _snapshot_name(c)).write_text(_help(*([c] if c else [])))
    sys.exit(0)
