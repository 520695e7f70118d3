"""`cbbench --help` and every subcommand's `--help` read well: exit 0, the command's summary, no typer artefact
(typer 0.2x labels flags `<bool>`, though a flag takes no value), comma-list options shown as lists; and the perf guide's
command block names every subcommand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cbbench.perf import cli

REPO = Path(__file__).resolve().parents[3]
COMMANDS = sorted(get_command(cli.app).commands)
ARTEFACT = re.compile(r"<(bool|NoneType|list\[bool\])>")
WIDE = {"COLUMNS": "200", "NO_COLOR": "1"}  # one row per option, so a row can be checked whole


def _help(*args: str) -> str:
    res = CliRunner().invoke(cli.app, [*args, "--help"], env=WIDE)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("command", COMMANDS)
def test_subcommand_help_exits_0_without_artefacts(command: str) -> None:
    out = _help(command)
    click_cmd = get_command(cli.app).commands[command]
    assert f" {command} [OPTIONS]" in out
    summary = (click_cmd.help or "").strip().splitlines()[0]
    assert summary[:40] in " ".join(out.split())  # (rich may wrap it)
    assert not ARTEFACT.search(out), ARTEFACT.search(out).group(0)
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ --")}
    for param in click_cmd.params:
        opt = next((o for o in getattr(param, "opts", []) if o.startswith("--")), None)
        if opt is None or opt not in rows:
            continue
        if getattr(param, "is_flag", False):  # a flag's row names no type at all
            assert "<" not in rows[opt].split("│")[1], rows[opt]


def test_sweepable_options_show_a_comma_list() -> None:
    rows = {line.split()[1]: line for line in _help("perf").splitlines() if line.startswith("│ --")}
    for opt, item in (("--max-num-batched-tokens", "int"), ("--request-rate", "float"), ("--batching", "str")):
        assert f"<{item},...>" in rows[opt], rows[opt]


def test_top_level_help_lists_every_command() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "cbbench.perf.cli", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, **WIDE},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert not ARTEFACT.search(res.stdout)
    for command in COMMANDS:
        assert re.search(rf"│ {re.escape(command)} ", res.stdout), command


def test_perf_guide_command_block_names_every_subcommand() -> None:
    readme = (REPO / "docs" / "perf.md").read_text()
    start = readme.index("# The perf suite")
    block = readme[readme.index("```bash", start) : readme.index("```\n", readme.index("```bash", start) + 7)]
    lines = [line for line in block.splitlines() if line.startswith("cbbench ")]
    for command in COMMANDS:
        assert any(line.split()[1] == command for line in lines), (
            f"docs/perf.md's command block lacks cbbench {command}"
        )


def test_serve_describes_every_option() -> None:
    """issue 28: `serve --help` left --port and --device (and --seed) without a word."""
    serve = get_command(cli.app).commands["serve"]
    bare = [
        p.opts[0] for p in serve.params if p.opts[0].startswith("--") and not (getattr(p, "help", "") or "").strip()
    ]
    assert bare == []
    rows = {line.split()[1]: line for line in _help("serve").splitlines() if line.startswith("│ --")}
    assert "TCP port" in rows["--port"] and "sim:<gpu>" in rows["--device"]
