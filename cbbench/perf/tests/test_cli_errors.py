"""Every `cbbench` command ends a failure with ONE line on stderr and a non-zero exit: bad input exits 2 before
anything runs (nothing is written), an interrupt 130, a bug 1 ("internal error", traceback only with
CBBENCH_DEBUG=1)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_runs import invoke, one_line
from tiny_run import TINY_RUN  # perf/tests/tiny_run.py (pytest puts this folder on sys.path)

from cbbench.perf.cli import main as cli

TINY = TINY_RUN + ["--peers", "none", "--batching", "continuous"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--workload-param", "input_len=abc"], "workload-param input_len: expected an integer, got 'abc'"),
        (["--device", "tpu"], "device must be cpu, cuda, cuda:N or a simulated GPU (sim:"),
        (["--cpu-threads", "-1"], "--cpu-threads must be >= 0"),
        (["--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
        (["--repeats", "0"], "repeats must be >= 1"),
        # the infeasible configuration is the sweep's second: it must fail before the first runs
        (
            ["--max-num-batched-tokens", "512,8", "--no-enable-chunked-prefill"],
            "--max-num-batched-tokens=8 with --enable-chunked-prefill=False",
        ),
        (["--num-gpu-blocks", "64,1"], "more than --num-gpu-blocks=1"),
        (["--max-model-len", "64,8"], "under --max-model-len=8"),
    ],
)
def test_perf_bad_input_is_one_line_exit_2_and_nothing_runs(tmp_path, monkeypatch, args, needle):
    from cbbench.perf.backends import in_process

    def never(*a, **k):
        raise AssertionError("a run started")

    monkeypatch.setattr(in_process, "run_refengine", never)
    res = invoke("perf", *TINY, "--result-dir", str(tmp_path), *args)
    assert res.exit_code == 2, res.output
    assert needle in one_line(res)
    assert not list(tmp_path.iterdir())


def test_unwritable_result_dir_fails_before_the_run(tmp_path, monkeypatch):
    from cbbench.perf.backends import in_process

    monkeypatch.setattr(in_process, "run_refengine", lambda *a, **k: pytest.fail("a run started"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = invoke("perf", *TINY, "--result-dir", str(blocker / "sub"))
    assert res.exit_code == 2 and "result-dir: cannot write to" in one_line(res)
    res = invoke("perf", *TINY, "--result-dir", str(blocker))
    assert res.exit_code == 2 and "is not a folder" in one_line(res)


def test_internal_error_is_one_line_exit_1(monkeypatch, tmp_path):
    def boom(opts, console):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(cli, "run_perf", boom)
    res = invoke("perf", "--result-dir", str(tmp_path))
    assert res.exit_code == 1
    line = one_line(res)
    assert line.startswith("cbbench perf: internal error: RuntimeError: boom") and "CBBENCH_DEBUG" in line
    res = invoke("perf", "--result-dir", str(tmp_path), env={cli.DEBUG_ENV: "1"})
    assert res.exit_code == 1 and "Traceback" in res.stderr and res.stderr.count("internal error") == 1


def test_interrupt_is_one_line_exit_130(monkeypatch, tmp_path):
    def interrupted(opts, console):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_perf", interrupted)
    res = invoke("perf", "--result-dir", str(tmp_path))
    assert res.exit_code == 130 and one_line(res) == "cbbench perf: interrupted"


def test_compare_errors_go_to_stderr_and_markup_is_printed_as_is(tmp_path):
    base = tmp_path / "[bold]x.csv"
    base.write_text("not,a,results,csv\n1,2,3,4\n")
    res = invoke("compare", str(base), str(tmp_path / "[red]missing.csv"))
    assert res.exit_code == 2 and res.stdout == ""
    assert "[bold]x.csv" in one_line(res) or "[red]missing.csv" in one_line(res)


def test_compare_bad_tolerance_is_one_line(tmp_path):
    res = invoke("compare", "a.csv", "b.csv", "--tolerance", "output_throughput")
    assert res.exit_code == 2 and "expected METRIC=VALUE" in one_line(res)


def test_plot_out_folder_writes_inside_it(tmp_path):
    import csv
    from pathlib import Path

    # the baseline's rows, half of them at another max_num_seqs: a sweep of that knob (plot refuses a non-sweep)
    rows = list(csv.DictReader((Path(__file__).resolve().parents[3] / "results" / "baselines" / "cpu.csv").open()))
    for row in rows[::2]:
        row["max_num_seqs"] = "8"
    baseline = tmp_path.parent / f"{tmp_path.name}-sweep.csv"
    with baseline.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    res = invoke("plot", str(baseline), "--knob", "max_num_seqs", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    (png,) = tmp_path.iterdir()
    assert png.parent == tmp_path and png.read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path.parent / f"{tmp_path.name}.png").exists()
    res = invoke("plot", str(baseline), "--knob", "max_num_seqs", "--out", str(tmp_path / "plot.txt"))
    assert res.exit_code == 2 and "txt" in one_line(res)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--iters", "0"], "iters must be >= 1, got 0"),
        (["--running", "0,32"], "running: expected a comma list of integers >= 1"),
        (["--running", "a"], "running: expected a comma list of integers"),
    ],
)
def test_bench_scheduler_bad_input(args, needle):
    res = invoke("bench-scheduler", *args)
    assert res.exit_code == 2 and needle in one_line(res)


def test_kernels_without_gpu_suggests_a_real_option(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU: the real bench would run")
    res = invoke("kernels", "--out", str(tmp_path / "k.csv"))
    line = one_line(res)
    assert res.exit_code == 2 and "--allow-cpu" in line
    assert "--allow-cpu" in invoke("kernels", "--help", env={"COLUMNS": "200"}).output  # the option it names exists


def test_usage_and_input_errors_through_the_installed_entry_point():
    """Through `python -m` (the app's own __call__, not the test runner): still one line."""
    for args, code, prefix in (
        (["perf", "--device", "tpu"], 2, "cbbench perf: error:"),
        (["compare", "/nonexistent/a.csv", "/nonexistent/b.csv"], 2, "cbbench compare: error:"),
    ):
        res = subprocess.run(
            [sys.executable, "-m", "cbbench.perf.cli", *args], capture_output=True, text=True, timeout=120
        )
        assert res.returncode == code, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(prefix), res.stderr


def test_errors_name_the_flag_the_user_typed_and_the_api_the_field():
    """issue 28: `cbbench perf` said `max_num_seqs`, which no one can type; the API keeps the field's name."""
    for command in (["perf", *TINY], ["serve"]):
        res = invoke(*command, "--max-num-seqs", "0")
        assert res.exit_code == 2
        assert one_line(res).startswith(f"cbbench {command[0]}: error: --max-num-seqs must be an integer in [1, "), res
    from refengine.config import SchedulerConfig

    with pytest.raises(ValueError, match=r"^max_num_seqs must be an integer"):
        SchedulerConfig(max_num_seqs=0)


def test_flag_wording_leaves_paths_flags_and_other_names_alone():
    from cbbench.perf.cli.wording import flag_wording

    class Param:
        def __init__(self, name: str, flag: str) -> None:
            self.name, self.opts = name, [flag]

    params = [Param("max_num_seqs", "--max-num-seqs"), Param("device", "--device"), Param("output", "--output")]
    assert flag_wording("device: max_num_seqs=4 too big", params) == "--device: --max-num-seqs=4 too big"
    assert flag_wording("output: /tmp/max_num_seqs.csv exists", params) == "--output: /tmp/max_num_seqs.csv exists"
    assert flag_wording("--max-num-seqs and input_len", params) == "--max-num-seqs and input_len"
    assert flag_wording("the device is busy; device: x", params) == "the device is busy; device: x"  # subject only
