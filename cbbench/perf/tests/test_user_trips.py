"""What a new user trips on, each ending in one clear line and the exit code a script expects: a missing file names
the file (no `[Errno 2]`), an address with no server is refused before anything runs or is written, an unsimulated
tensor-parallel size is refused before the grid starts, the table's title names the model and its tensor-parallel
size, markdown on a terminal shows no HTML escapes, and a CPU table says why continuous batching gains little there."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest
from cli_runs import invoke, one_line
from rich.console import Console

from cbbench.perf.report.show import render
from cbbench.perf.report.table import CPU_ECONOMICS, summary_lines
from cbbench.perf.report.table_title import table_title

BASELINE = str(Path(__file__).resolve().parents[3] / "results/baselines/cpu.csv")  # a CSV that exists
SUMMARY = {"num_requests": 4, "mean_prompt_len": 8.0, "max_prompt_len": 8, "mean_output_len": 4.0}
SUMMARY |= {"max_output_len": 4, "cv_output_len": 0.0}


@pytest.mark.parametrize(
    "args",
    [
        ["show", "{missing}"],
        ["compare", "{missing}", BASELINE],
        ["compare", BASELINE, "{missing}"],
        ["perf", "--like", "{missing}", "--dry-run"],
        ["report", "{missing_json}"],
    ],
)
def test_a_missing_file_is_one_line_naming_it(tmp_path, args):
    missing = tmp_path / "no-such.csv"
    argv = [a.format(missing=missing, missing_json=missing.with_suffix(".json")) for a in args]
    res = invoke(*argv)
    line = one_line(res)
    assert res.exit_code == 2 and "Errno" not in line, line
    assert line.endswith(("no-such.csv: no such file", "no-such.json: no such file")), line


def test_perf_against_an_address_with_no_server_exits_2_and_writes_nothing(tmp_path):
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        res = invoke(
            "perf", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}", "--model", "m",
            "--workload", "fixed", "--num-prompts", "2", "--result-dir", str(tmp_path),
        )  # fmt: skip
    line = one_line(res)
    assert res.exit_code == 2 and f"http://127.0.0.1:{port}: no server answers there" in line, res.output
    assert list(tmp_path.iterdir()) == []


def test_an_unsimulated_tensor_parallel_size_is_refused_before_the_grid_starts(tmp_path):
    res = invoke(
        "perf", "--device", "sim:h200", "--tensor-parallel-size", "1,3", "--num-prompts", "4",
        "--result-dir", str(tmp_path),
    )  # fmt: skip
    assert res.exit_code == 2 and "running" not in res.output, res.output
    assert one_line(res).endswith("--tensor-parallel-size=3: not simulated; use one of 1, 2, 4, 8 "
                                  "(the sizes the measured all-reduce tables cover)")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_the_title_names_the_model_and_its_tensor_parallel_size():
    rows = [{"model": "llama-3.1-70b", "tensor_parallel_size": tp, "device": "cuda"} for tp in (4, 4)]
    assert table_title("sharegpt", SUMMARY, {}, rows).startswith("cbbench perf of llama-3.1-70b, tensor parallel 4: ")
    rows[1]["tensor_parallel_size"] = 8
    assert "of llama-3.1-70b, tensor parallel 4, 8: " in table_title("sharegpt", SUMMARY, {}, rows)
    one = [{"model": "tiny-qwen2", "tensor_parallel_size": 1, "device": "cpu"}]
    assert table_title("sharegpt", SUMMARY, {}, one).startswith("cbbench perf of tiny-qwen2: sharegpt, 4 requests")


ROW = {"engine": "refengine", "device": "cpu", "model": "m", "output_throughput": 10.0, "peak_kv_usage": 0.001}


def entries(device: str) -> list:
    return [
        (("refengine", mode, "-"), {**ROW, "batching": mode, "device": device, "slot_waste": 1.2}, None)
        for mode in ("continuous", "static")
    ]


@pytest.mark.parametrize("terminal", [True, False])
def test_markdown_on_a_terminal_shows_no_html_escapes(terminal):
    out = io.StringIO()
    render(Console(file=out, force_terminal=terminal, width=200), entries("cpu"), None, "markdown")
    text = out.getvalue()
    assert ("<1%" in text and "&lt;" not in text) if terminal else ("&lt;1%" in text), text


def test_a_cpu_table_says_why_continuous_gains_little_and_names_the_simulated_command():
    assert summary_lines(entries("cpu"))[-1] == CPU_ECONOMICS
    assert "cbbench perf --device sim:h200 --workload sharegpt" in CPU_ECONOMICS
    assert CPU_ECONOMICS not in summary_lines(entries("sim:h200")) + summary_lines(entries("cuda"))
