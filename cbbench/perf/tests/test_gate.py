"""The gate's rules: regressions judged with the repeats' spread, every stored percentile gateable, unusable
inputs exit 2, tolerances that live with the baseline (sidecar) or in pyproject, and --format for CI summaries."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cbbench.perf.cli import app
from cbbench.perf.results.columns import LATENCY_COLUMNS
from cbbench.perf.results.compare import compare, main_compare
from cbbench.perf.results.files import write_csv
from cbbench.perf.results.schema import make_row
from cbbench.workloads.catalog import get_workload

KNOBS = {"max_num_seqs": 4, "block_size": 16, "dtype": "float32"}


def row(batching="continuous", repeat=0, *, tp=100.0, ttft=50.0, command="", **extra):
    metrics = {
        "request_throughput": tp / 10,
        "output_throughput": tp,
        "total_token_throughput": tp * 3,
        **{k: ttft for k in LATENCY_COLUMNS},
        **extra,
    }
    return make_row(
        metrics=metrics,
        engine="refengine",
        batching=batching,
        config=KNOBS,
        repeat=repeat,
        workload=get_workload("fixed", num_prompts=4, seed=0, input_len=8, output_len=4),
        model="tiny-qwen2",
        device="cpu",
        git_sha="abc",
        timestamp="2025-01-01T00:00:00+00:00",
        command=command,
    )


def csv(tmp_path, name, rows):
    return write_csv(tmp_path / name, rows)


def status(rows, metric):
    (r,) = [r for r in rows if r["metric"] == metric]
    return r["status"]


def gate(base, new, **kw):
    return main_compare(base, new, console=Console(file=open(str(new) + ".out", "w"), width=200), **kw)


@pytest.mark.parametrize(
    "new_tps, expected",
    [
        ([70.0, 80.0, 125.0], "noise"),  # median -20 % (beyond 5 %) but one repeat beats the baseline: noise
        ([70.0, 80.0, 90.0], "regressed"),  # every new repeat below every baseline repeat
        ([96.0, 97.0, 98.0], "ok"),  # apart, but within tolerance (-3 %)
        ([130.0, 140.0, 150.0], "improved"),
        ([90.0, 140.0, 150.0], "noise"),  # better beyond tolerance, but overlapping
    ],
)
def test_throughput_regression_needs_tolerance_and_spread(tmp_path, new_tps, expected):
    base = csv(tmp_path, "b.csv", [row(repeat=i, tp=v) for i, v in enumerate([95.0, 100.0, 110.0])])
    new = csv(tmp_path, "n.csv", [row(repeat=i, tp=v) for i, v in enumerate(new_tps)])
    rows, regressed = compare(base, new)
    assert status(rows, "output_throughput") == expected
    assert regressed == (expected == "regressed")
    assert gate(base, new) == (1 if expected == "regressed" else 0)


def test_latency_spread_rule_is_mirrored(tmp_path):
    base = csv(tmp_path, "b.csv", [row(repeat=i, ttft=v) for i, v in enumerate([50.0, 55.0, 60.0])])
    overlap = csv(tmp_path, "o.csv", [row(repeat=i, ttft=v) for i, v in enumerate([58.0, 70.0, 72.0])])
    apart = csv(tmp_path, "a.csv", [row(repeat=i, ttft=v) for i, v in enumerate([61.0, 70.0, 72.0])])
    assert status(compare(base, overlap)[0], "mean_ttft_ms") == "noise"
    assert status(compare(base, apart)[0], "mean_ttft_ms") == "regressed"


def test_single_runs_fall_back_to_the_tolerance(tmp_path):
    base = csv(tmp_path, "b.csv", [row(tp=100.0)])
    assert status(compare(base, csv(tmp_path, "n.csv", [row(tp=94.0)]))[0], "output_throughput") == "regressed"
    assert status(compare(base, csv(tmp_path, "m.csv", [row(tp=96.0)]))[0], "output_throughput") == "ok"


def test_every_stored_percentile_and_extra_ones_can_be_gated(tmp_path):
    assert {"p95_ttft_ms", "p99_ttft_ms", "p99.9_itl_ms", "p75_e2el_ms"} <= set(LATENCY_COLUMNS)
    base = csv(tmp_path, "b.csv", [row(p97_ttft_ms=10.0)])
    worse = csv(tmp_path, "n.csv", [row(p97_ttft_ms=20.0)])
    rows, regressed = compare(base, worse, {"p97_ttft_ms": 0.1, "p95_ttft_ms": 0.1})
    assert regressed and status(rows, "p97_ttft_ms") == "regressed" and status(rows, "p95_ttft_ms") == "ok"


def test_a_gated_metric_missing_from_the_new_file_fails(tmp_path):
    base = csv(tmp_path, "b.csv", [row()])
    r = row()
    r["p99_ttft_ms"] = None  # e.g. an old run that did not store p99
    rows, regressed = compare(base, csv(tmp_path, "n.csv", [r]))
    assert regressed and status(rows, "p99_ttft_ms") == "missing in new"


def test_zero_configurations_in_common_says_how_the_baseline_was_made(tmp_path, capsys):
    base = csv(tmp_path, "b.csv", [row("static", command="cbbench perf --batching static --max-num-seqs 4")])
    new = csv(tmp_path, "n.csv", [row("continuous")])
    assert gate(base, new, fail_on_missing=False) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0 configurations in common" in err[0]
    assert "cbbench perf --batching static --max-num-seqs 4" in err[0] and "--like" in err[0]


def _write(path, text):
    path.write_text(text)
    return path


def test_unusable_inputs_exit_2(tmp_path):
    good = csv(tmp_path, "good.csv", [row()])
    header_only = csv(tmp_path, "header.csv", [])
    text = good.read_text()
    truncated = _write(tmp_path / "trunc.csv", text[: len(text) - 40])
    lines = text.splitlines(keepends=True)
    cut_row = _write(tmp_path / "cutrow.csv", lines[0] + lines[1][: len(lines[1]) // 2] + "\n")
    r = row()
    r["output_throughput"] = "fast"
    text_metric = csv(tmp_path, "text.csv", [r])
    for bad in (header_only, truncated, cut_row, text_metric):
        assert gate(bad, good) == 2, bad.name
        assert gate(good, bad) == 2, bad.name
    assert gate(good, good) == 0


def test_sidecar_and_pyproject_tolerances(tmp_path, monkeypatch):
    base = csv(tmp_path, "base.csv", [row(tp=100.0)])
    new = csv(tmp_path, "new.csv", [row(tp=80.0)])  # -20 %: fails the 5 % default
    monkeypatch.chdir(tmp_path)
    assert gate(base, new) == 1
    _write(tmp_path / "pyproject.toml", '[tool.cbbench.tolerances]\n"*_throughput" = "25%"\n')
    assert gate(base, new) == 0  # project-wide tolerance
    _write(tmp_path / "base.tolerances.toml", '[tolerances]\n"output_throughput" = 0.1\n')
    assert gate(base, new) == 1  # the baseline's own file is stronger
    assert gate(base, new, tolerance_overrides={"output_throughput": None}) == 0  # --tolerance is strongest
    assert gate(base, new, use_tolerance_files=False) == 1
    _write(tmp_path / "base.tolerances.toml", '[tolerances]\n"output_throughput" = true\n')
    assert gate(base, new) == 2


def test_format_markdown_and_json_through_the_cli(tmp_path):
    base = csv(tmp_path, "base.csv", [row(tp=100.0), row("static")])
    new = csv(tmp_path, "new.csv", [row(tp=50.0), row("static")])
    res = CliRunner().invoke(app, ["compare", str(base), str(new), "--format", "markdown"])
    assert res.exit_code == 1
    assert res.stdout.startswith("### cbbench compare") and "**FAIL**" in res.stdout
    assert "| refengine fixed continuous | output\\_throughput | 100 | 50 | -50.0% | 5% | **regressed** |" in res.stdout
    res = CliRunner().invoke(app, ["compare", str(base), str(base), "--format", "json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and doc["regressed"] is False and doc["configurations_in_common"] == 2
    assert {r["status"] for r in doc["rows"]} <= {"ok", "n/a"}
    res = CliRunner().invoke(app, ["compare", str(base), str(base), "--format", "html"])
    assert res.exit_code == 2 and "format must be one of" in res.stderr
