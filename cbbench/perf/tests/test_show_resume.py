"""The perf table from saved results (`cbbench show`, `perf --format`), `--resume`'s table over the whole file, and
the exit code of a run that measured nothing, for each in-process backend."""

from __future__ import annotations

import json

from tiny_run import TINY_RUN  # perf/tests/tiny_run.py (pytest puts this folder on sys.path)
from typer.testing import CliRunner

from cbbench.perf.cli import main as cli

TINY = TINY_RUN + ["--peers", "none"]


def invoke(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def test_resumed_table_covers_the_whole_file_and_show_reprints_it(tmp_path, monkeypatch):
    from cbbench.perf.backends import in_process

    real, calls = in_process.run_refengine, []

    def interrupted_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(in_process, "run_refengine", interrupted_third)
    out = tmp_path / "run.csv"
    args = ["perf", *TINY, "--batching", "continuous,static", "--repeats", "2", "--output", str(out)]
    assert invoke(*args).exit_code == 130
    res = invoke(*args, "--resume", "--format", "json")
    assert res.exit_code == 0, res.output
    table = json.loads(res.stdout)
    assert {(r["batching"], r["repeats"]) for r in table["runs"]} == {("continuous", 2), ("static", 2)}
    shown = invoke("show", str(out), "--format", "json")
    assert shown.exit_code == 0 and json.loads(shown.stdout) == table  # the same medians and spread
    text = invoke("show", str(out))
    assert text.exit_code == 0 and "continuous" in text.stdout and "±" in text.stdout
    md = invoke("show", str(out), "--format", "markdown")
    assert md.exit_code == 0 and md.stdout.startswith("| engine | batching |")
    (out.with_suffix(".json")).unlink()  # without the JSON the rows are still named by their key columns
    assert {r["batching"] for r in json.loads(invoke("show", str(out), "--format", "json").stdout)["runs"]} == {
        "continuous",
        "static",
    }
    assert invoke("show", str(out), "--format", "html").exit_code == 2


def test_in_process_run_whose_every_request_failed_exits_1(tmp_path, monkeypatch):
    from cbbench.perf.backends import in_process

    real = in_process.run_refengine

    def all_failed(*a, **k):
        r = real(*a, **k)
        for rec in r.records:
            rec.finish_reason, rec.error = "error", "planted"
        return r

    monkeypatch.setattr(in_process, "run_refengine", all_failed)
    res = invoke("perf", *TINY, "--batching", "continuous", "--result-dir", str(tmp_path))
    assert res.exit_code == 1, res.output
    (line,) = res.stderr.strip().splitlines()
    assert "refengine continuous: every request failed (3 of 3)" in line
    assert len(list(tmp_path.glob("*.csv"))) == 1  # what was measured is kept


def test_hf_peer_that_produced_no_result_exits_1(tmp_path, monkeypatch):
    from cbbench.perf.backends import hf

    def broken(*a, **k):
        raise RuntimeError("planted peer failure")

    monkeypatch.setattr(hf, "_generate_batch", broken)
    res = invoke("perf", *TINY[:-2], "--peers", "hf-static", "--batching", "continuous", "--result-dir", str(tmp_path))
    assert res.exit_code == 1, res.output
    (line,) = res.stderr.strip().splitlines()
    assert "hf-static static" in line and "produced no result" in line and "planted peer failure" in line


def test_serve_and_in_process_perf_use_the_same_default_threads(monkeypatch):
    import torch

    from cbbench.perf.plan.options import DEFAULT_CPU_THREADS
    from refengine.entrypoints import launch
    from refengine.sim.sim_device import DeviceSpec

    set_to: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    monkeypatch.setattr(launch, "run_server", lambda *a, **k: None)
    assert invoke("serve").exit_code == 0
    assert invoke("serve", "--cpu-threads", "3").exit_code == 0
    assert set_to == [DEFAULT_CPU_THREADS, 3]
    from cbbench.perf import sweep

    plan = type("P", (), {"settings": type("S", (), {"device": DeviceSpec.parse("cpu"), "cpu_threads": None})()})()
    sweep._set_threads(plan)
    assert set_to[-1] == DEFAULT_CPU_THREADS
