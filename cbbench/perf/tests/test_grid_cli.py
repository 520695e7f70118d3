"""`--executor` at the command line: what each form parses to, the default a plan gets, and the one-line refusals
(exit 2) for an executor that cannot run the plan's runs. Only `--dry-run`s: nothing runs."""

from __future__ import annotations

import pytest
from cli_runs import invoke, one_line
from tiny_run import TINY_RUN

from cbbench.perf.plan import executor as ex
from cbbench.perf.plan.executor import ExecutorChoice, parse_executor

SIM = ["--device", "sim:h200", "--workload", "fixed", "--num-prompts", "4", "--peers", "none"]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (None, None),
        ("serial", ExecutorChoice("serial")),
        ("pool", ExecutorChoice("pool")),
        ("pool:3", ExecutorChoice("pool", workers=3)),
        ("ray", ExecutorChoice("ray")),
        ("ray:auto", ExecutorChoice("ray", address="auto")),
        ("ray:10.0.0.1:6379", ExecutorChoice("ray", address="10.0.0.1:6379")),
    ],
)
def test_executor_forms(text, want) -> None:
    assert parse_executor(text) == want


@pytest.mark.parametrize("text", ["threads", "pool:0", "pool:x", "pool:", "ray:", "serial:2"])
def test_a_bad_executor_is_one_line_naming_the_option(text: str) -> None:
    res = invoke("perf", *SIM, "--executor", text, "--dry-run")
    assert res.exit_code == 2
    assert one_line(res).startswith("cbbench perf: error: --executor: ")


def test_a_simulated_plan_defaults_to_a_pool_and_a_cpu_plan_to_serial(monkeypatch) -> None:
    monkeypatch.setattr(ex.os, "cpu_count", lambda: 4)
    res = invoke("perf", *SIM, "--max-num-seqs", "2,4,8", "--batching", "continuous", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "; executor pool (3 worker processes)" in res.stdout.splitlines()[0]  # no more workers than runs
    res = invoke("perf", *TINY_RUN, "--batching", "continuous", "--peers", "none", "--dry-run")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].endswith("; executor serial")


def test_pool_refuses_real_device_runs() -> None:
    res = invoke("perf", *TINY_RUN, "--executor", "pool", "--dry-run")
    assert res.exit_code == 2
    line = one_line(res)
    assert line.startswith("cbbench perf: error: --executor: pool runs simulated runs only")
    assert "would time each other" in line


def test_ray_refuses_cpu_runs_and_server_backends() -> None:
    res = invoke("perf", *TINY_RUN, "--executor", "ray", "--dry-run")
    assert res.exit_code == 2 and "CPU runs would share their hosts' cores" in one_line(res)
    res = invoke(
        "perf", "--backend", "openai", "--base-url", "http://127.0.0.1:9", "--workload", "fixed", "--num-prompts",
        "2", "--executor", "pool", "--dry-run",
    )  # fmt: skip
    assert res.exit_code == 2 and "every run goes to the one server" in one_line(res)


def test_ray_missing_is_the_one_line_that_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setattr(ex.importlib.util, "find_spec", lambda name: None if name == "ray" else object())
    res = invoke("perf", *SIM, "--executor", "ray", "--dry-run")
    assert res.exit_code == 2
    assert one_line(res) == "cbbench perf: error: --executor ray needs Ray: pip install 'cbbench[ray]'"


def test_like_takes_an_executor() -> None:
    """--like fixes what runs; how it runs (the executor) may still be given, and is checked."""
    from pathlib import Path

    baseline = Path(__file__).resolve().parents[3] / "results" / "baselines" / "sim-h200.csv"
    res = invoke("perf", "--like", str(baseline), "--executor", "serial", "--dry-run")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].endswith("; executor serial")
    res = invoke("perf", "--like", str(baseline), "--executor", "pool:x", "--dry-run")
    assert res.exit_code == 2 and one_line(res).startswith("cbbench perf: error: --executor: ")
