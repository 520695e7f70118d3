"""The `cbbench` command line: typer commands only, each a thin call into the package that does the work."""

from cbbench.perf.cli.main import app

__all__ = ["app"]
