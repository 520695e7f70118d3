"""Small CPU checks of the `cbbench` command line: a tiny perf run writes the CSV schema and the JSON, `compare`'s
exit codes, `timeline` writes a PNG, and bad input ends with one line on stderr and exit code 2.

Sizes are tiny (3 prompts of 8 tokens, 4 output tokens) so the whole file runs in well under a minute on 2 cores;
`--cpu-threads 0` leaves torch's thread count alone for the rest of the session.
"""

import pandas as pd
import pytest
from tiny_run import TINY_RUN  # perf/tests/tiny_run.py (pytest puts this folder on sys.path)
from typer.testing import CliRunner

from cbbench.perf.cli import app
from cbbench.perf.results.columns import COLUMNS
from cbbench.perf.results.files import read_csv
from cbbench.perf.results.run_json import read_run

TINY = TINY_RUN


# a terminal wide enough for the whole table, whatever runs the tests (an xdist worker has no terminal: 80 columns)
WIDE = {"COLUMNS": "250"}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


@pytest.fixture(scope="module")
def perf_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("perf")
    res = invoke("perf", *TINY, "--batching", "continuous,static", "--peers", "hf-static", "--result-dir", str(out))
    assert res.exit_code == 0, res.output
    (csv,) = out.glob("*.csv")
    (js,) = out.glob("*.json")
    return csv, js, res.output


def test_perf_writes_csv_with_schema(perf_run):
    csv, _, _ = perf_run
    df = read_csv(csv)  # checks schema_version and the column order
    assert tuple(df.columns) == COLUMNS
    got = {(r.engine, r.batching) for r in df.itertuples()}
    assert got == {("refengine", "continuous"), ("refengine", "static"), ("hf-static", "static")}
    assert (df["completed"] == 3).all() and (df["total_output_tokens"] == 12).all()  # only useful tokens count
    assert (df["output_throughput"] > 0).all()
    static = df[df.engine == "refengine"].set_index("batching")
    assert static.loc["static", "slot_waste"] >= 1.0


def test_perf_writes_json_records_and_table(perf_run):
    _, js, output = perf_run
    doc = read_run(js)
    assert doc["workload"]["name"] == "fixed" and doc["environment"]["git_sha"]
    assert len(doc["rows"]) == 3
    for label, recs in doc["records"].items():
        assert [r["output_len"] for r in recs] == [4, 4, 4], label
    assert any(label.startswith("refengine/static") for label in doc["steps"])
    assert "÷ static" in output and "refengine continuous / hf-static" in output


def test_compare_exit_codes(perf_run, tmp_path):
    csv, _, _ = perf_run
    assert invoke("compare", str(csv), str(csv)).exit_code == 0
    df = pd.read_csv(csv)
    df["output_throughput"] = df["output_throughput"] * 0.5  # a planted regression
    worse = tmp_path / "worse.csv"
    df.to_csv(worse, index=False)
    assert invoke("compare", str(csv), str(worse)).exit_code == 1
    assert invoke("compare", str(csv), str(worse), "--tolerance", "output_throughput=60%").exit_code == 0
    assert invoke("compare", str(csv), str(tmp_path / "missing.csv")).exit_code == 2


def test_timeline_writes_png(tmp_path):
    out = tmp_path / "t.png"
    res = invoke(
        "timeline", "--out", str(out), "--num-requests", "4", "--max-num-seqs", "2", "--batching", "continuous,static"
    )
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--workload", "nosuch"], "unknown name 'nosuch'"),
        (["--batching", "continuous,dynamic"], "batching must be one of"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be an integer"),
        (["--block-size", "sixteen"], "--block-size: expected a comma list of integers"),
        (["--preemption-mode", "evict"], "--preemption-mode must be one of"),
        (["--peers", "vllm"], "unknown peer 'vllm'"),
        (["--workload-param", "no_such_param=3"], "no_such_param"),
        (["--goodput", "latency:5"], "goodput"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    res = invoke("perf", *TINY, "--peers", "none", "--result-dir", str(tmp_path), *args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_kernels_without_gpu_is_one_line(tmp_path):
    res = invoke("kernels", "--out", str(tmp_path / "k.csv"))
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU: the real bench would run")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["perf", "--bogus"], ["perf", "--num-prompts", "many"]])
def test_usage_error_is_one_line_and_exit_2(args):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "cbbench.perf.cli", *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error:"), res.stderr


def test_piped_output_prints_each_written_path_on_one_line(tmp_path):
    """issue 28: `cbbench perf ... | cat` (no terminal: 80 columns) wrapped the result paths across lines."""
    deep = tmp_path / ("a-folder-name-long-enough-that-the-paths-pass-eighty-columns" * 2)
    csv = deep / "run.csv"
    res = CliRunner().invoke(
        app, ["perf", *TINY, "--peers", "none", "--batching", "continuous", "--output", str(csv)], env={"COLUMNS": ""}
    )
    assert res.exit_code == 0, res.output
    wrote = f"wrote {csv}, {csv.with_suffix('.json')} and {csv.with_suffix('.records')}/"
    assert wrote in res.stdout.splitlines(), res.stdout
