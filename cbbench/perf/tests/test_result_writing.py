"""Each run is written as it finishes, atomically, CSV and JSON together: Ctrl-C keeps the finished runs and
`--resume` completes the file; `--label` and `--output` name the runs and the file."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from tiny_run import TINY_RUN  # perf/tests/tiny_run.py (pytest puts this folder on sys.path)
from typer.testing import CliRunner

from cbbench.perf.backends import in_process
from cbbench.perf.cli import app
from cbbench.perf.results import schema as results
from cbbench.perf.results.files import read_csv, write_csv
from cbbench.perf.results.run_json import read_run

TINY = TINY_RUN + ["--peers", "none", "--batching", "continuous,static"]


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_interrupt_keeps_finished_runs_and_resume_completes(tmp_path, monkeypatch):
    out = tmp_path / "run.csv"
    real = in_process.run_refengine
    calls = []

    def second_run_interrupted(*a, **k):
        calls.append(k["engine_args"].config.scheduler.batching)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(in_process, "run_refengine", second_run_interrupted)
    res = invoke("perf", *TINY, "--output", str(out), "--label", "try1")
    assert res.exit_code == 130
    line = res.stderr.strip().splitlines()
    assert len(line) == 1 and "1 run(s) kept in" in line[0] and "--resume" in line[0]
    df = read_csv(out)
    doc = read_run(out.with_suffix(".json"))
    assert list(df["batching"]) == ["continuous"] and list(df["label"]) == ["try1"]
    assert len(doc["rows"]) == 1 and list(doc["records"]) == ["refengine/continuous/-/repeat0"]
    assert len(doc["records"]["refengine/continuous/-/repeat0"]) == 3
    first = df.iloc[0].to_dict()

    calls.clear()
    res = invoke("perf", *TINY, "--output", str(out), "--label", "try1", "--resume")
    assert res.exit_code == 0, res.output
    assert calls == ["static"]  # only the missing run ran
    df = read_csv(out)
    doc = read_run(out.with_suffix(".json"))
    assert list(df["batching"]) == ["continuous", "static"]
    assert df.iloc[0]["timestamp"] == first["timestamp"] and df.iloc[0]["duration"] == first["duration"]
    assert len(doc["rows"]) == 2 and set(doc["records"]) == {
        "refengine/continuous/-/repeat0",
        "refengine/static/-/repeat0",
    }
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left behind

    calls.clear()
    res = invoke("perf", *TINY, "--output", str(out), "--resume")
    assert res.exit_code == 0 and calls == [] and len(read_csv(out)) == 2  # nothing left to do


def test_output_is_not_overwritten_and_resume_checks_the_workload(tmp_path, monkeypatch):
    out = tmp_path / "run.csv"
    monkeypatch.setattr(in_process, "run_refengine", lambda *a, **k: pytest.fail("a run started"))
    write_csv(out, [])
    res = invoke("perf", *TINY, "--output", str(out))
    assert res.exit_code == 2 and "exists; add --resume" in res.stderr
    res = invoke("perf", *TINY, "--resume")
    assert res.exit_code == 2 and "--output" in res.stderr


def test_resume_refuses_another_workload(tmp_path):
    out = tmp_path / "run.csv"
    args = [a if a != "input_len=8,output_len=4" else "input_len=6,output_len=4" for a in TINY]
    assert invoke("perf", *args, "--batching", "continuous", "--output", str(out)).exit_code == 0
    res = invoke("perf", *TINY, "--output", str(out), "--resume")
    assert res.exit_code == 2 and "another workload" in res.stderr


def test_rows_record_the_command_and_run_options(tmp_path):
    out = tmp_path / "r.csv"
    res = invoke("perf", *TINY, "--batching", "static", "--output", str(out), "--label", "mine")
    assert res.exit_code == 0, res.output
    df = read_csv(out)
    cmd = df.loc[0, "command"]
    assert cmd.startswith("cbbench perf ") and "--batching static" in cmd and "--max-num-seqs 2" in cmd
    assert "--label mine" in cmd and df.loc[0, "label"] == "mine"
    opts = json.loads(df.loc[0, "run_options"])
    assert opts["warmup"] == 1 and opts["cpu_threads"] == 0 and "plan_id" in opts
    assert df.loc[0, "attention_backend"] == "torch" and pd.notna(df.loc[0, "p95_ttft_ms"])


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "r.csv"
    path.write_text("old contents\n")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(results.os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_csv(path, [])
    assert path.read_text() == "old contents\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.csv"]  # the temporary file was removed
    monkeypatch.undo()
    write_csv(path, [])
    assert path.read_text().startswith("schema_version,label,")


def test_two_runs_in_one_second_get_two_files(tmp_path):
    from cbbench.perf.grid.build import _fresh

    first = _fresh(tmp_path, "fixed-20250101-000000")
    write_csv(first, [])
    second = _fresh(tmp_path, "fixed-20250101-000000")
    assert first.name == "fixed-20250101-000000.csv" and second.name == "fixed-20250101-000000-2.csv"
