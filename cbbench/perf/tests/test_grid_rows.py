"""Serial, pool and Ray runs of one deterministic simulated grid write the same files: the same CSV rows in plan
order (less the run-specific columns), the same records and steps in the JSON; a worker killed mid-grid costs no
finished row and its run is retried on a fresh worker; a run whose worker always dies is given up, the grid goes
on, and `--resume` completes the file in plan order.

The grid is 2 x 2 knob sets of 16 fixed requests, continuous batching, on a simulated H200 (4 runs, well under a
second each: most of each test is starting workers, and Ray).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import signal
import threading
from pathlib import Path

import pytest
from grid_backends import DieAlways, DieOnce, HoldOnce
from rich.console import Console

from cbbench.perf.exceptions import NoResultError
from cbbench.perf.grid.build import build_plan
from cbbench.perf.grid.order import RUN_SPECIFIC_COLUMNS
from cbbench.perf.knobs import KnobGrid
from cbbench.perf.plan.executor import parse_executor
from cbbench.perf.plan.options import (
    BackendOptions,
    EngineOptions,
    OutputOptions,
    PerfOptions,
    RunOptions,
    WorkloadOptions,
)
from cbbench.perf.results.run_json import read_run
from cbbench.perf.sweep import run_plan
from refengine.sim.sim_device import DeviceSpec
from refengine.tests.waiting import HANG_GUARD_S, HangGuard, wait_for

GRID = PerfOptions(
    workload=WorkloadOptions("fixed", num_prompts=16, params=("input_len=256,output_len=32",)),
    engine=EngineOptions(
        "llama-3.1-8b",
        batching=EngineOptions.parse_batching("continuous"),
        knobs=KnobGrid.parse({"max_num_seqs": "8,16", "max_num_batched_tokens": "1024,2048"}),
    ),
    device=DeviceSpec.checked("sim:h200"),
    backend=BackendOptions(peers=BackendOptions.parse_peers("none")),
)
TARGET = 2  # the run whose worker dies: the third in plan order, so runs before and after it finish around it
# how long the killer thread waits for the held worker (a fork and a plan: seconds on a busy 2-core host): a hang
# guard, as long as the suite's (refengine/tests/waiting.py), since a slow fork is load, not a failure
KILL_WAIT_S = HANG_GUARD_S


def run_grid(
    out: Path, executor: str | None, backend: type | None = None, marker: Path | None = None, resume: bool = False
):
    """Build the grid's plan (`backend` in place of refengine's, aimed at run TARGET), run it; (plan, output)."""
    options = dataclasses.replace(
        GRID,
        run=RunOptions(executor=parse_executor(executor)),
        output=OutputOptions(output=out, resume=resume, quiet=True),
    )
    plan = build_plan(options)
    if backend is not None:
        plan.backends["refengine"] = backend(plan.settings, marker, plan.specs[TARGET].plan_id)
    console = Console(file=io.StringIO(), width=250)
    try:
        run_plan(plan, console)
    finally:
        output = console.file.getvalue()
    return plan, output


def files(csv_path: Path) -> dict:
    """What every executor must write alike: the CSV's cells less the run-specific columns; the JSON's rows (less
    the same), records and steps, in file order."""
    with csv_path.open(newline="") as f:
        cells = [{k: v for k, v in r.items() if k not in RUN_SPECIFIC_COLUMNS} for r in csv.DictReader(f)]
    doc = read_run(csv_path.with_suffix(".json"))
    rows = [{k: v for k, v in r.items() if k not in RUN_SPECIFIC_COLUMNS} for r in doc["rows"]]
    return {"csv": cells, "rows": rows, "records": list(doc["records"].items()), "steps": list(doc["steps"].items())}


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[str]]:
    out = tmp_path_factory.mktemp("serial") / "serial.csv"
    plan, _ = run_grid(out, "serial")
    return files(out), [s.plan_id for s in plan.specs]


def plan_ids(csv_path: Path) -> list[str]:
    with csv_path.open(newline="") as f:
        return [json.loads(r["run_options"])["plan_id"] for r in csv.DictReader(f)]


def test_the_serial_grid_is_the_plan_in_order(serial: tuple[dict, list[str]]) -> None:
    got, ids = serial
    assert len(got["csv"]) == 4 and [json.loads(r["run_options"])["plan_id"] for r in got["csv"]] == ids
    assert len({r["output_throughput"] for r in got["csv"]}) > 1  # the knobs matter: rows that differ are compared


def test_a_pool_writes_the_serial_files(tmp_path: Path, serial: tuple[dict, list[str]]) -> None:
    _, output = run_grid(tmp_path / "pool.csv", "pool:2")
    assert files(tmp_path / "pool.csv") == serial[0]
    assert "4 run(s) on pool (2 worker processes)" in output


def test_a_killed_pool_worker_loses_no_row_and_its_run_is_retried(
    tmp_path: Path, serial: tuple[dict, list[str]]
) -> None:
    killed: list[int] = []

    def kill_when_held() -> None:
        try:  # a hang guard, in waiting.py: load only delays the held worker, the assert below is on the order
            wait_for(lambda: (tmp_path / "held.pid").exists(), "the held worker", KILL_WAIT_S)
        except HangGuard:
            return
        if (tmp_path / "held.pid").exists():
            killed.append(int((tmp_path / "held.pid").read_text()))
            os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_when_held, daemon=True)
    killer.start()
    _, output = run_grid(tmp_path / "pool.csv", "pool:2", HoldOnce, tmp_path)
    killer.join()
    assert killed, "the held worker never showed up"
    attempts = (tmp_path / "attempts.txt").read_text().split()
    assert len(attempts) == 2 and attempts[0] == str(killed[0]) != attempts[1]  # retried on a fresh worker
    assert f"its worker (pid {killed[0]}) was killed by SIGKILL; tried again (attempt 2 of 3)" in output
    assert files(tmp_path / "pool.csv") == serial[0]


def test_a_run_whose_worker_always_dies_is_given_up_and_resume_completes_the_file(
    tmp_path: Path, serial: tuple[dict, list[str]]
) -> None:
    out = tmp_path / "pool.csv"
    with pytest.raises(NoResultError, match="produced no result: its worker died on all 3 attempts"):
        run_grid(out, "pool:2", DieAlways, tmp_path)
    assert len((tmp_path / "attempts.txt").read_text().split()) == 3
    ids = serial[1]
    assert plan_ids(out) == ids[:TARGET] + ids[TARGET + 1 :]  # every other run kept, in plan order
    run_grid(out, "pool:2", resume=True)  # the lost run appended last, then the files put in plan order
    got, want = files(out), serial[0]
    # a resumed file's JSON rows hold the kept rows' cells as the CSV has them, as text (ResultWriter's resume)
    assert [{k: str(v) for k, v in r.items()} for r in got.pop("rows")] == [
        {k: str(v) for k, v in r.items()} for r in want["rows"]
    ]
    assert got == {k: v for k, v in want.items() if k != "rows"}


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'cbbench[ray]' (ci/setup.sh does)")
    here = str(Path(__file__).parent)  # grid_backends must import in Ray's workers, which inherit this environment
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, old) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)


def test_ray_writes_the_serial_files(tmp_path: Path, serial: tuple[dict, list[str]], ray_cluster) -> None:
    _, output = run_grid(tmp_path / "ray.csv", "ray")
    assert files(tmp_path / "ray.csv") == serial[0]
    assert "4 run(s) on ray" in output
    assert ray_cluster.is_initialized()  # a cluster the caller started is left running


def test_a_ray_worker_that_dies_is_retried_by_ray(tmp_path: Path, serial: tuple[dict, list[str]], ray_cluster) -> None:
    run_grid(tmp_path / "ray.csv", "ray", DieOnce, tmp_path)
    attempts = (tmp_path / "attempts.txt").read_text().split()
    assert (tmp_path / "died").exists() and len(attempts) == 2 and attempts[0] != attempts[1]
    assert files(tmp_path / "ray.csv") == serial[0]
