"""rows.py reads a results CSV into the same cells as schema.read_csv's DataFrame, and aggregates repeats to the same
medians and spreads, without pandas: `compare` and `show` use it, the other commands the DataFrame."""

from __future__ import annotations

import math
import re

import pytest

from cbbench.perf.results.columns import METRIC_COLUMNS
from cbbench.perf.results.files import read_csv, write_csv
from cbbench.perf.results.rows import aggregate_rows, read_rows, with_extra_metrics
from cbbench.perf.results.schema import aggregate_repeats, extra_metrics, make_row


def _row(repeat: int, batching: str, tps: float | None, **kw) -> dict:
    metrics = {"output_throughput": tps, "median_ttft_ms": 10.0 + repeat, "p97_ttft_ms": 30.0 + repeat, "completed": 4}
    return make_row(
        metrics=metrics,
        engine="refengine",
        workload="fixed",
        batching=batching,
        config={"max_num_seqs": 8, "enable_chunked_prefill": True, "dtype": "float32"},
        repeat=repeat,
        model="tiny-qwen2",
        device="cpu",
        git_sha="abc",
        timestamp="2026-01-01T00:00:00+00:00",
        **kw,
    )


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


@pytest.fixture
def results(tmp_path):
    rows = [
        _row(0, "continuous", 100.0, label="=cmd", command="cbbench perf --label x"),
        _row(1, "continuous", 104.0, label="NA"),  # pandas reads NA as missing: both readers must
        _row(2, "continuous", math.inf, label="1"),
        _row(0, "static", None, label="'quoted"),
    ]
    return write_csv(tmp_path / "r.csv", rows)


def test_cells_are_read_csv_cells(results):
    want = read_csv(results).to_dict("records")
    got = read_rows(results)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert list(g) == list(w)
        diff = {k: (g[k], w[k]) for k in w if not _same(g[k], w[k])}
        assert not diff


def test_extra_metrics_and_aggregates_are_the_dataframes(results):
    metrics = [*METRIC_COLUMNS, "p97_ttft_ms"]
    want = aggregate_repeats(extra_metrics(read_csv(results)), metrics).to_dict("records")
    got = aggregate_rows(with_extra_metrics(read_rows(results)), metrics)
    assert [r["num_repeats"] for r in got] == [3, 1]
    for g, w in zip(got, want):
        assert list(g) == list(w)
        diff = {k: (g[k], w[k]) for k in w if not _same(g[k], w[k])}  # the type too: compare's JSON prints it
        assert not diff
    assert got[0]["p97_ttft_ms"] == 31.0 and got[0]["output_throughput_max"] == math.inf


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda t: t[: t.rindex("\n", 0, len(t) - 1) + 5], "truncated"),
        (lambda t: t.replace("schema_version", "version", 1), "no schema_version"),
        (lambda t: t.splitlines()[0] + "\n", "no result rows"),
        (lambda t: t.replace("\n5,", "\n9,", 1), "schema_version [5, 9]"),
    ],
)
def test_damage_is_refused_as_read_csv_refuses_it(results, damage, message):
    results.write_text(damage(results.read_text()))
    with pytest.raises(ValueError, match=re.escape(message)):
        read_rows(results)
    with pytest.raises(ValueError, match=re.escape(message)):
        read_csv(results)
