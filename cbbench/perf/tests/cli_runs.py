"""The CLI tests' way to run `cbbench` in-process and read its one-line errors."""

from __future__ import annotations

from typer.testing import CliRunner, Result

from cbbench.perf import cli


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli.app, list(args), env=env)


def one_line(res: Result) -> str:
    """The single line a failing command wrote to stderr (asserts there is exactly one)."""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]
