"""Results that stay small at any scale: each run's records go into Parquet files of their own, written once (pandas
and polars read the folder), the CSV is appended, the JSON stays a summary of a fixed size; a grid of a thousand runs
rewrites nothing and the writer keeps no record; `--resume` completes an interrupted grid from what is on disk, to
the same rows and records as a run that was never interrupted; a JSON of an older cbbench, records inside, still
reads; a long run's timeline in the report has a bounded size."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.perf.backends import in_process
from cbbench.perf.cli import app
from cbbench.perf.records import RequestRecord, StepRecord
from cbbench.perf.report.html import load_run, render_html
from cbbench.perf.report.timeline_svg import BIN_PX, KINDS, MAX_WIDTH_PX, run_svg
from cbbench.perf.results.files import read_csv, write_csv, write_run_json
from cbbench.perf.results.record_files import RecordFiles, records_dir
from cbbench.perf.results.run_json import read_run
from cbbench.perf.results.writer import ResultWriter, plan_id
from cbbench.workloads.catalog import get_workload

# a simulated grid: deterministic (the cost model's virtual clock), so an interrupted and resumed file can be
# compared cell for cell and record for record with one that ran through
SIM = [
    "perf",
    "--device",
    "sim:h200",
    "--model",
    "llama-3.1-8b",
    "--workload",
    "fixed",
    "--workload-param",
    "input_len=16,output_len=4",
    "--num-prompts",
    "3",
    "--peers",
    "none",
    "--batching",
    "continuous",
    "--max-num-seqs",
    "1,2,3,4",
    "--executor",
    "serial",
    "--quiet",
]
RUN_SPECIFIC = ("timestamp", "command", "duration")  # wall-clock cells: differ between any two runs
RECORDS_PER_RUN = 8
# a run's share of memory the writer may keep: its CSV row (a few kB), never its records (this test's are ~20 kB)
KEPT_BYTES_PER_RUN = 6_000


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def comparable(csv_path: Path) -> tuple[list[dict], dict, dict]:
    df = read_csv(csv_path)
    rows = df.astype(object).where(df.notna(), None).to_dict("records")  # NaN is not NaN: compare empty as None
    doc = read_run(csv_path.with_suffix(".json"))
    return [{k: v for k, v in r.items() if k not in RUN_SPECIFIC} for r in rows], doc["records"], doc["steps"]


def test_records_are_parquet_files_pandas_and_polars_read_and_the_json_is_a_summary(tmp_path):
    out = tmp_path / "run.csv"
    res = invoke(*SIM, "--output", str(out))
    assert res.exit_code == 0, res.output
    doc = json.loads(out.with_suffix(".json").read_text())
    assert "records" not in doc and "steps" not in doc and "rows" not in doc
    assert doc["record_files"]["requests"] == "run.records/requests"
    requests = sorted((tmp_path / "run.records" / "requests").glob("*.parquet"))
    assert len(requests) == 4 == len(list((tmp_path / "run.records" / "steps").glob("*.parquet")))
    import pandas as pd

    df = pd.read_parquet(tmp_path / "run.records" / "requests")
    assert len(df) == 12 and df["run"].nunique() == 4 and set(df["output_len"]) == {4}
    pl = pytest.importorskip("polars", reason="polars is a test dependency (pip install 'cbbench[test]')")
    steps = pl.read_parquet(str(tmp_path / "run.records" / "steps" / "*.parquet"))
    assert steps.height == len(pd.read_parquet(tmp_path / "run.records" / "steps")) > 0
    # the same records the run JSON used to hold, by run, in row order
    back = read_run(out.with_suffix(".json"))
    assert [len(v) for v in back["records"].values()] == [3, 3, 3, 3]
    first = next(iter(back["records"].values()))[0]
    assert list(first) == list(RequestRecord.from_dict(first).to_dict())  # the record's own keys, in order


def test_interrupted_grid_resumes_to_the_rows_and_records_of_an_uninterrupted_one(tmp_path, monkeypatch):
    whole = tmp_path / "whole.csv"
    assert invoke(*SIM, "--output", str(whole)).exit_code == 0
    real, calls = in_process.run_refengine, []

    def third_run_interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    cut = tmp_path / "cut.csv"
    monkeypatch.setattr(in_process, "run_refengine", third_run_interrupted)
    assert invoke(*SIM, "--output", str(cut)).exit_code == 130
    assert len(read_csv(cut)) == 2 and len(RecordFiles(records_dir(cut)).runs()) == 2
    monkeypatch.setattr(in_process, "run_refengine", real)
    res = invoke(*SIM, "--output", str(cut), "--resume")
    assert res.exit_code == 0, res.output
    assert comparable(cut) == comparable(whole)


def test_a_kill_between_record_files_and_row_is_undone_by_resume(tmp_path, monkeypatch):
    """SIGKILL after a run's record files and before its CSV row (or mid-row): resume drops both and runs it again."""
    whole = tmp_path / "whole.csv"
    assert invoke(*SIM, "--output", str(whole)).exit_code == 0
    cut = tmp_path / "cut.csv"
    real_add, adds = ResultWriter.add, []

    def killed_on_third(self, row, label, records, steps, server_series=None):
        adds.append(label)
        if len(adds) == 3:  # what a kill leaves: the run's files, and half its row
            self.files.write_run(label, json.loads(row["run_options"])["plan_id"], records, steps)
            with self.csv_path.open("a") as f:
                f.write("3,refengine,half a ro")
            raise KeyboardInterrupt
        real_add(self, row, label, records, steps, server_series)

    monkeypatch.setattr(ResultWriter, "add", killed_on_third)
    invoke(*SIM, "--output", str(cut))
    assert len(RecordFiles(records_dir(cut)).runs()) == 3
    monkeypatch.setattr(ResultWriter, "add", real_add)
    res = invoke(*SIM, "--output", str(cut), "--resume")
    assert res.exit_code == 0, res.output
    assert comparable(cut) == comparable(whole)
    assert len(RecordFiles(records_dir(cut)).runs()) == 4


def _records(run: int) -> tuple[list[RequestRecord], list[StepRecord]]:
    reqs = [
        RequestRecord(str(i), 100, 50, 0.0, 0.01, 0.02, [0.02 + 0.001 * t for t in range(50)], 0.07, 0, 0, "length", 0)
        for i in range(RECORDS_PER_RUN)
    ]
    steps = [StepRecord(0.001 * t, 8, 8, 0, 0, 8, 20, 0, None, ["0", "1"], ["0", "1"], [], None) for t in range(50)]
    return reqs, steps


def _row(i: int) -> dict:
    from cbbench.perf.results.columns import COLUMNS, SCHEMA_VERSION

    row = dict.fromkeys(COLUMNS)
    row.update(schema_version=SCHEMA_VERSION, engine="refengine", batching="continuous", workload="fixed")
    row.update(workload_params="{}", max_num_seqs=i, output_throughput=float(i))
    row["run_options"] = json.dumps({"plan_id": plan_id("refengine", "continuous", {"max_num_seqs": i}, "-", 0)})
    return row


@pytest.mark.parametrize("runs", [300, pytest.param(1000, marks=pytest.mark.slow)])
def test_a_large_grid_rewrites_nothing_and_keeps_no_record(tmp_path, runs):
    w = get_workload("fixed", num_prompts=2, seed=0, input_len=8, output_len=4)
    writer = ResultWriter(tmp_path / "grid.csv", config={"x": 1}, environment={"git_sha": None}, workload=w)
    summary = writer.json_path.read_bytes()
    reqs, steps = _records(0)
    tracemalloc.start()
    try:
        for i in range(runs):
            writer.add(_row(i), f"refengine/continuous/max_num_seqs={i}/repeat0", reqs, steps)
            if i == 99:
                early = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in writer.files.root.rglob("*.parquet")}
                csv_early = (writer.csv_path.stat().st_ino, writer.csv_path.read_bytes())
                mem_early = tracemalloc.get_traced_memory()[0]
                disk_early = sum(p.stat().st_size for p in writer.files.root.rglob("*.parquet"))
        mem_late = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    writer.finish()
    # nothing written before is written again: the first runs' files untouched, the CSV appended in place
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in early} == early
    assert writer.csv_path.stat().st_ino == csv_early[0] and writer.csv_path.read_bytes().startswith(csv_early[1])
    assert writer.json_path.read_bytes() == summary  # a summary of fixed size, whatever the grid's
    # the records are on disk, linearly, and not in memory
    disk = sum(p.stat().st_size for p in writer.files.root.rglob("*.parquet"))
    assert disk <= disk_early * runs / 100 * 1.05
    assert mem_late - mem_early < KEPT_BYTES_PER_RUN * (runs - 100)
    assert len(read_csv(writer.csv_path)) == runs and len(writer.files.runs()) == runs


def _old_pair(tmp_path: Path) -> Path:
    """A results pair as cbbench wrote it before the records moved out: every record inside the JSON."""
    out = tmp_path / "new.csv"
    assert invoke(*SIM, "--output", str(out)).exit_code == 0
    doc = read_run(out.with_suffix(".json"))
    old = tmp_path / "old.csv"
    rows = read_csv(out).astype(object).where(read_csv(out).notna(), None).to_dict("records")
    write_csv(old, rows)
    write_run_json(
        old.with_suffix(".json"),
        config=doc["config"],
        environment=doc["environment"],
        workload=doc["workload"],
        rows=rows,
        records=doc["records"],
        steps=doc["steps"],
    )
    return old


def test_an_older_json_with_records_inside_still_reads_and_resumes(tmp_path):
    old = _old_pair(tmp_path)
    assert "records" in json.loads(old.with_suffix(".json").read_text())
    res = invoke("show", str(old), "--format", "markdown")
    assert res.exit_code == 0 and res.output.count("| refengine | continuous |") == 4
    page = tmp_path / "old.html"
    res = invoke("report", str(old.with_suffix(".json")), "-o", str(page))
    assert res.exit_code == 0, res.output
    assert page.read_text().count('class="timeline-svg"') == 4
    assert invoke("compare", str(old), str(tmp_path / "new.csv")).exit_code == 0
    before = read_run(old.with_suffix(".json"))["records"]
    res = invoke(*SIM, "--output", str(old), "--resume")  # the records move into the folder, once
    assert res.exit_code == 0, res.output
    assert "records" not in json.loads(old.with_suffix(".json").read_text())
    assert read_run(old.with_suffix(".json"))["records"] == before


def _long_run(requests: int) -> dict:
    """Steps of a continuous run of `requests` requests through 64 slots, each request 3 steps long."""
    steps, running, nxt = [], [], 0
    while nxt < requests or running:
        while len(running) < 64 and nxt < requests:
            running.append([str(nxt), 0])
            nxt += 1
        ids = [r for r, _ in running]
        prefill = [r for r, age in running if age == 0]
        steps.append({"scheduled_req_ids": ids, "running_req_ids": ids, "prefill_req_ids": prefill, "batch_id": None})
        running = [[r, age + 1] for r, age in running if age < 2]
    return {"steps": steps}


def test_a_long_runs_timeline_is_drawn_aggregated_at_a_bounded_size():
    colours = [(0.5, 0.5, 0.5)]
    small = run_svg(_long_run(200), 64, colours)
    assert "aggregated" not in small and small.count("<rect") > 200  # a rectangle per request stretch
    big = run_svg(_long_run(20_000), 64, colours)
    rects = big.count("<rect")
    assert "aggregated" in big and 0 < rects <= len(KINDS) * MAX_WIDTH_PX // BIN_PX
    assert len(big) < 400_000  # bytes: some 60 MB drawn a rectangle per request stretch


def test_report_of_a_summary_pairs_records_with_rows_by_plan_entry(tmp_path):
    out = tmp_path / "run.csv"
    assert invoke(*SIM, "--output", str(out)).exit_code == 0
    doc = load_run(out.with_suffix(".json"))
    seqs = [int(r["max_num_seqs"]) for r in doc["rows"]]
    labels = [k.split("/")[2] for k in doc["records"]]
    assert labels == [f"max_num_seqs={s}" for s in seqs]
    os.remove(tmp_path / "run.records" / "runs" / "run-000002.json")
    doc = load_run(out.with_suffix(".json"))  # a run whose records are gone: the others keep their rows
    assert len(doc["records"]) == 3 and len(render_html(doc)) > 0
