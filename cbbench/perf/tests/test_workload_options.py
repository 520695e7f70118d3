"""The `cbbench perf` options of the workloads users bring: `--time-scale` (trace), the `--hf-*` column options,
the help of `--dataset-path` / `--tokenizer`, and a missing dataset as one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.perf.cli import app
from cbbench.perf.plan.options import WorkloadOptions, workload_kwargs

WIDE = {"COLUMNS": "200", "NO_COLOR": "1"}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


def _trace(tmp_path: Path) -> str:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t, "input_len": 4, "output_len": 2}) + "\n" for t in (0, 1, 3)))
    return str(p)


def _plan_error(*args: str) -> str:
    res = invoke("perf", *args, "--num-prompts", "3", "--peers", "none", "--quiet", "--dry-run")
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    return res.output


def test_time_scale_and_hf_flags_set_the_workload_params(tmp_path):
    kw = workload_kwargs(WorkloadOptions("trace", dataset_path="x", time_scale=2.0), None, on_cpu=True)
    assert kw["time_scale"] == 2.0
    kw = workload_kwargs(
        WorkloadOptions("hf", dataset_path="x", hf_split="test", hf_column="q", hf_output_column="n", hf_output_len=7),
        None,
        on_cpu=True,
    )
    assert (kw["split"], kw["column"], kw["output_column"], kw["output_len"]) == ("test", "q", "n", 7)
    with pytest.raises(ValueError, match="--hf-split does not apply to workload 'fixed'"):
        workload_kwargs(WorkloadOptions("fixed", hf_split="test"), None, on_cpu=True)
    with pytest.raises(ValueError, match="--time-scale does not apply"):
        workload_kwargs(WorkloadOptions("fixed", time_scale=2.0), None, on_cpu=True)


def test_time_scale_reaches_the_trace_through_the_cli(tmp_path):
    out = _plan_error("--workload", "trace", "--dataset-path", _trace(tmp_path), "--time-scale", "0")
    assert "--time-scale" in out  # the CLI names the flag (the API, the field: time_scale)
    res = invoke(
        "perf",
        "--workload",
        "trace",
        "--dataset-path",
        _trace(tmp_path),
        "--time-scale",
        "2",
        "--num-prompts",
        "3",
        "--peers",
        "none",
        "--dry-run",
    )
    assert res.exit_code == 0, res.output


def test_hf_column_reaches_the_dataset_through_the_cli(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"question": "how far is it"}) + "\n")
    assert "column: 'nope' not found" in _plan_error(
        "--workload", "hf", "--dataset-path", str(p), "--hf-column", "nope"
    )


@pytest.mark.parametrize("workload", ["custom", "hf", "trace", "sharegpt-multiturn"])
def test_a_missing_dataset_is_one_line_and_exit_2(tmp_path, workload):
    out = _plan_error("--workload", workload, "--dataset-path", str(tmp_path / "nowhere.jsonl"))
    assert "does not exist" in out or "nowhere" in out


def test_help_names_the_dataset_formats_and_the_hub_rule():
    text = " ".join(invoke("perf", "--help").output.split())
    for name in ("sharegpt", "custom", "hf", "trace", "sharegpt-multiturn", "--time-scale", "--hf-split"):
        assert name in text
    assert "hub id needs its files in a local folder" in text
