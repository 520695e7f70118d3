"""Result files under abuse: formula-safe CSV cells, escaped markdown and report data, stale temporaries, output
names that would clash, and inputs that must end with one line and exit 2 (or 1 when a run measured nothing)."""

from __future__ import annotations

import csv
import json
import os
import re

import pytest
from cli_runs import invoke, one_line
from tiny_run import TINY_RUN  # perf/tests/tiny_run.py (pytest puts this folder on sys.path)

from cbbench.perf.results.files import read_csv, write_csv
from cbbench.perf.results.run_json import read_run
from cbbench.perf.results.schema import make_row
from cbbench.workloads.catalog import get_workload

TINY = TINY_RUN + ["--peers", "none", "--batching", "continuous"]
CSV_FIELD_LIMIT = 131072  # python's csv module refuses a longer field by default
HOSTILE = ['=HYPERLINK("http://x","y")', "+1+1", "-cmd|' /C calc'!A0", "@SUM(A1)", "'=already", "plain"]


def row(label: str = "", batching: str = "continuous", **metrics):
    m = {"output_throughput": 100.0, "request_throughput": 1.0, "mean_ttft_ms": 10.0, **metrics}
    return make_row(
        metrics=m,
        engine="refengine",
        batching=batching,
        config={"max_num_seqs": 2},
        workload=get_workload("fixed", num_prompts=2, seed=0, input_len=8, output_len=4),
        model="tiny-qwen2",
        device="cpu",
        git_sha="abc",
        label=label,
        command=label,
    )


@pytest.mark.parametrize("label", HOSTILE)
def test_user_strings_are_neutralised_and_read_back(tmp_path, label):
    path = write_csv(tmp_path / "r.csv", [row(label, mean_ttft_ms=-1.5)])
    raw = next(csv.DictReader(path.open(newline="")))
    for col in ("label", "command"):
        assert not raw[col].startswith(("=", "+", "-", "@")), raw[col]  # a spreadsheet shows text, runs nothing
    assert raw["mean_ttft_ms"] == "-1.5"  # numbers stay numbers
    df = read_csv(path)
    assert df["label"].iloc[0] == label and df["command"].iloc[0] == label


def test_resume_keeps_user_strings_exact(tmp_path):
    from cbbench.perf.results.writer import ResultWriter

    w = get_workload("fixed", num_prompts=2, seed=0, input_len=8, output_len=4)
    path = write_csv(tmp_path / "r.csv", [row("=x")])
    writer = ResultWriter(path, config={}, environment={"git_sha": None}, workload=w, resume=True)
    writer.finish(writer.rows)
    writer.finish(writer.rows)  # rewriting a resumed row must not mark it twice
    assert read_csv(path)["label"].tolist() == ["=x"]


def test_stale_temporaries_of_the_same_result_are_removed(tmp_path):
    from cbbench.perf.results.writer import ResultWriter

    stale = [tmp_path / ".run.csv.k1ll3d.tmp", tmp_path / ".run.json.k1ll3d.tmp"]
    other = tmp_path / ".other.csv.abc.tmp"  # another result's: not ours to remove
    for p in (*stale, other):
        p.write_text("half")
    ResultWriter(tmp_path / "run.csv", config={}, environment={"git_sha": None}, workload=None)
    assert not any(p.exists() for p in stale) and other.exists()


def test_output_json_name_is_refused(tmp_path, monkeypatch):
    from cbbench.perf.backends import in_process

    monkeypatch.setattr(in_process, "run_refengine", lambda *a, **k: pytest.fail("a run started"))
    res = invoke("perf", *TINY, "--output", str(tmp_path / "run.json"))
    assert res.exit_code == 2 and "the CSV and its JSON the same file" in one_line(res)
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)  # like /dev/full: not a file a rename may replace
    res = invoke("perf", *TINY, "--output", str(fifo))
    assert res.exit_code == 2 and "not a regular file" in one_line(res)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.csv"]


def test_huge_num_prompts_is_refused_before_any_workload_is_built(monkeypatch, tmp_path):
    from cbbench.perf.grid import build
    from cbbench.workloads.catalog import MAX_NUM_PROMPTS

    monkeypatch.setattr(build, "build_workload", lambda *a, **k: pytest.fail("a workload was built"))
    res = invoke("perf", *TINY, "--num-prompts", str(10**12), "--result-dir", str(tmp_path))
    assert res.exit_code == 2 and f"--num-prompts must be <= {MAX_NUM_PROMPTS}" in one_line(res)


def test_csv_field_over_the_csv_limit_is_one_line(tmp_path):
    path = write_csv(tmp_path / "big.csv", [row("x" * (CSV_FIELD_LIMIT + 1))])
    res = invoke("compare", str(path), str(path))
    assert res.exit_code == 2 and "not a readable CSV" in one_line(res)


@pytest.mark.parametrize("metric, value", [("mean_ttft_ms", -float("inf")), ("output_throughput", float("inf"))])
def test_compare_refuses_non_finite_metrics_naming_the_row(tmp_path, metric, value):
    good = write_csv(tmp_path / "good.csv", [row(), row(batching="static")])
    bad = write_csv(tmp_path / "bad.csv", [row(), row(batching="static", **{metric: value})])
    for args in ([good, bad], [bad, good]):
        res = invoke("compare", *map(str, args))
        line = one_line(res)
        assert res.exit_code == 2 and f"metric {metric}" in line and "row 2" in line and "static" in line


def test_compare_where_filters_both_files(tmp_path):
    base = write_csv(tmp_path / "base.csv", [row(), row(batching="static", output_throughput=1.0)])
    new = write_csv(tmp_path / "new.csv", [row(), row(batching="static", output_throughput=100.0)])
    res = invoke("compare", str(base), str(new), "--where", "batching=continuous", "--format", "json")
    assert res.exit_code == 0 and json.loads(res.stdout)["configurations_in_common"] == 1
    res = invoke("compare", str(base), str(new), "--where", "batching=sequence")
    assert res.exit_code == 2 and "no row of the baseline file has batching=sequence" in one_line(res)
    res = invoke("compare", str(base), str(new), "--where", "colour=red")
    assert res.exit_code == 2 and "where: 'colour=red'" in one_line(res)


def test_compare_markdown_escapes_labels_and_paths(tmp_path):
    evil = "<img src=x onerror=alert(1)>**b**|[l](javascript:x)"
    folder = tmp_path / "<b>dir"
    folder.mkdir()
    base = write_csv(folder / "base.csv", [row(evil)])
    res = invoke("compare", str(base), str(base), "--format", "markdown")
    assert res.exit_code == 0, res.output
    assert "<img" not in res.stdout and "<b>" not in res.stdout and "&lt;img" in res.stdout
    assert "**b**" not in res.stdout and "](javascript" not in res.stdout
    assert all(line.count("|") - line.count("\\|") in (0, 8) for line in res.stdout.splitlines())


def _run_json(tmp_path, name="run.json", **changes):
    rec = {
        "request_id": "0",
        "prompt_len": 8,
        "output_len": 2,
        "arrival_time": 0.0,
        "first_scheduled_time": 0.0,
        "first_token_time": 0.1,
        "token_times": [0.1, 0.2],
        "finish_time": 0.2,
        "num_preemptions": 0,
        "num_cached_tokens": 0,
        "finish_reason": "length",
    }
    r = row()
    doc = {
        "schema_version": 2,
        "environment": {},
        "config": {},
        "workload": {"name": "fixed"},
        "rows": [r],
        "records": {"refengine/continuous/-/repeat0": [rec]},
        "steps": {},
    }
    doc.update(changes)
    path = tmp_path / name
    path.write_text(json.dumps(doc, default=str))
    return path


@pytest.mark.parametrize(
    "changes",
    [
        {"records": {"refengine/continuous/-/repeat0": ["not a record"]}},
        {"rows": ["not a row"]},
        {"steps": ["not by run"]},
    ],
)
def test_report_on_malformed_records_is_one_line(tmp_path, changes):
    res = invoke("report", str(_run_json(tmp_path, **changes)), "-o", str(tmp_path / "r.html"))
    assert res.exit_code == 2, res.output
    assert "run JSON" in one_line(res) or "not " in one_line(res)


def test_report_on_a_huge_knob_and_to_a_device(tmp_path):
    huge = row()
    huge["max_num_seqs"] = 1e12  # the timeline drew one row per slot: a MemoryError, exit 1
    step = {
        "time": 0.1,
        "num_scheduled_tokens": 1,
        "num_running": 1,
        "num_waiting": 0,
        "scheduled_req_ids": ["0"],
        "running_req_ids": ["0"],
        "slots_held": 1,
    }
    run = _run_json(tmp_path, rows=[huge], steps={"refengine/continuous/-/repeat0": [step, step]})
    res = invoke("report", str(run), "-o", str(tmp_path / "r.html"))
    assert res.exit_code == 0, res.output
    assert 'class="timeline-svg"' in (tmp_path / "r.html").read_text()
    fifo = tmp_path / "full"
    os.mkfifo(fifo)  # stands for /dev/full: a device must not be replaced by the page
    res = invoke("report", str(_run_json(tmp_path)), "-o", str(fifo))
    assert res.exit_code == 2 and "not a regular file" in one_line(res)
    assert not fifo.is_file()


def test_report_data_block_cannot_be_ended_by_a_name(tmp_path):
    from cbbench.perf.report.html import render_html

    names = ["<!--<script>", "</script><b>x</b>", "a&b"]
    doc = read_run(_run_json(tmp_path))
    rec = doc["records"]["refengine/continuous/-/repeat0"][0]
    doc["records"] = {f"refengine/continuous/{n}/repeat0": [rec] for n in names}
    doc["rows"] = [dict(doc["rows"][0], batching="continuous") for _ in names]
    page = render_html(doc, source="run.json")
    m = re.search(r'<script type="application/json" id="cdf-data">(.*?)</script>', page, re.S)
    block = m.group(1)
    assert "<" not in block and ">" not in block  # nothing in it can open a comment or close the element
    assert all(
        n in json.dumps(json.loads(block)) or json.dumps(n)[1:-1] in json.dumps(json.loads(block)) for n in names
    )
    assert page.count("<script>") == 1 and page.index("<script>") > m.end()  # the page script stays whole
