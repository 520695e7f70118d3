"""The typed plan of `cbbench perf`: built once from the options, one `RunSpec` per run in the order they run,
and printed by `--dry-run` without running or writing anything."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from cbbench.perf.cli import app
from cbbench.perf.grid.build import build_plan
from cbbench.perf.knobs import KnobGrid
from cbbench.perf.plan.options import (
    BackendOptions,
    EngineOptions,
    OutputOptions,
    PerfOptions,
    RunOptions,
    WorkloadOptions,
)

FIXED = WorkloadOptions("fixed", num_prompts=3, params=("input_len=8,output_len=4",))


def test_plan_holds_one_spec_per_run_in_order(tmp_path):
    o = PerfOptions(
        workload=FIXED,
        engine=EngineOptions(
            batching=EngineOptions.parse_batching("continuous,static"), knobs=KnobGrid.parse({"max_num_seqs": "2,3"})
        ),
        backend=BackendOptions(peers=BackendOptions.parse_peers("hf-static")),
        run=RunOptions(repeats=2, warmup=1),
        output=OutputOptions(result_dir=tmp_path),
    )
    plan = build_plan(o)
    runs = [(s.repeat, s.backend, s.batching, s.knobs.max_num_seqs) for s in plan.specs]
    one = [
        ("refengine", "continuous", 2),
        ("refengine", "static", 2),
        ("refengine", "continuous", 3),
        ("refengine", "static", 3),
        ("hf-static", "static", 2),
        ("hf-static", "static", 3),
    ]
    # interleaved: the second repeat runs the first's order backward (plan/spec.py's `interleaved`, the gate's ABBA)
    assert runs == [(0, *r) for r in one] + [(1, *r) for r in reversed(one)]
    assert sorted(plan.backends) == ["hf-static", "refengine"]
    assert plan.specs[0].varying == {"max_num_seqs"} and len(plan.workload) == 3
    assert plan.config["batching_modes"] == ["continuous", "static"] and plan.config["peers"] == ["hf-static"]
    assert len({s.plan_id for s in plan.specs}) == len(plan.specs)


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "perf",
            "--workload",
            "fixed",
            "--workload-param",
            "input_len=8,output_len=4",
            "--num-prompts",
            "3",
            "--batching",
            "continuous,static",
            "--peers",
            "none",
            "--max-num-seqs",
            "2,3",
            "--result-dir",
            str(tmp_path),
            "--dry-run",
        ],
    )
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("workload fixed: 3 requests; 4 run(s)")
    assert lines[1:] == [
        f"  refengine {mode}, max_num_seqs={n}, repeat 1/1" for n in (2, 3) for mode in ("continuous", "static")
    ]
    assert not list(tmp_path.glob("*.csv")) and not list(tmp_path.glob("*.json"))


# how a device string used to be asked what it is; perf asks refengine's DeviceSpec instead
STRING_TESTS = re.compile(r"""startswith\(\s*["'](sim:|cuda)|[!=]=\s*["']cpu["']|["']cpu["']\s*[!=]=|is_sim_device\(""")
PERF = Path(__file__).resolve().parents[1]


def _string_tests(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if STRING_TESTS.search(line)]


def test_perf_asks_the_device_seam_not_the_device_string():
    """What differs for a simulated GPU (or the CPU, or CUDA) is DeviceSpec's to say: a module of perf that tests
    the device string itself has put a `"sim:"` branch back outside the seam. (perf/bench/ holds the
    micro-benchmark commands, with devices of their own, outside the plan.)"""
    offenders = {
        str(p.relative_to(PERF)): found
        for p in sorted(PERF.rglob("*.py"))
        if "tests" not in p.parts and "bench" not in p.parts and (found := _string_tests(p.read_text()))
    }
    assert offenders == {}


def test_the_string_test_check_sees_each_spelling():
    planted = 'if device.startswith("sim:"):\nif o.device == "cpu":\nif "cpu" != d:\nif is_sim_device(x):\nok = 1\n'
    assert len(_string_tests(planted)) == 4
