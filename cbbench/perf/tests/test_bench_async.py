"""`cbbench bench-async`: the command runs both modes on one workload, checks their tokens agree and prints the
ratio. No time is asserted: the ratio is read off the output (a benchmark, not a timed test)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from cbbench.perf.bench.async_overlap import bench_async
from cbbench.perf.cli import app


def test_bench_async_prints_both_modes_and_the_ratio() -> None:
    res = CliRunner().invoke(
        app, ["bench-async", "--num-requests", "3", "--prompt-len", "5", "--max-tokens", "4", "--repeats", "2"]
    )
    assert res.exit_code == 0, res.output
    rows = [line.split() for line in res.output.splitlines() if re.match(r"\s*(True|False)\s+\d", line)]
    assert [r[0] for r in rows] == ["False", "True"]
    assert re.search(r"async / sync throughput: \d+\.\d{3}x", res.output)


def test_both_modes_run_the_same_tokens_with_the_sleeping_stub() -> None:
    sync, asyn = bench_async(4, 6, 5, repeats=1, device_ms=1.0)
    assert (sync.async_scheduling, asyn.async_scheduling) == (False, True)
    assert sync.output_tokens == asyn.output_tokens == 4 * 5  # ignore_eos: every request runs to max_tokens
    assert len(sync.seconds) == len(asyn.seconds) == 1


def test_bench_async_rejects_bad_sizes() -> None:
    res = CliRunner().invoke(app, ["bench-async", "--num-requests", "0"])
    assert res.exit_code == 2 and "num-requests" in res.output
