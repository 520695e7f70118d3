"""The grid executors' benchmark: one simulated grid of `--configs` runs (default 200: 10 max_num_seqs x 10 token
budgets x continuous, static), run serially, on the local process pool and on Ray, the wall time of each and its
ratio to the serial run's. Not a test: the host's load decides the numbers, so it prints and asserts nothing,
except that every executor wrote the same rows (less the run-specific columns), which it says.

    python -m benchmarks.grid [--configs 200] [--num-prompts 16] [--executors serial,pool,ray] [--out DIR]

Each run is 16 fixed requests (256 prompt, 32 output tokens) on a simulated H200. The wall time is `run_plan`'s
(the plan is built once per executor, outside it): the pool's includes starting its workers, Ray's includes
`ray.init()` of a local cluster and its shutdown, as `cbbench perf --executor ray` pays them.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from cbbench.perf.grid.build import build_plan
from cbbench.perf.grid.order import RUN_SPECIFIC_COLUMNS
from cbbench.perf.knobs import KnobAxis, KnobGrid
from cbbench.perf.plan.executor import parse_executor
from cbbench.perf.plan.options import (
    BackendOptions,
    EngineOptions,
    OutputOptions,
    PerfOptions,
    RunOptions,
    WorkloadOptions,
)
from cbbench.perf.sweep import run_plan
from refengine.sim.sim_device import DeviceSpec


def grid_knobs(configs: int) -> KnobGrid:
    """max_num_seqs x max_num_batched_tokens lists whose product with the 2 modes is `configs` runs (or just over)."""
    pairs = math.ceil(configs / 2)
    a = math.isqrt(pairs)
    b = math.ceil(pairs / a)
    return KnobGrid(
        (
            KnobAxis.of("max_num_seqs", [4 * (i + 1) for i in range(a)]),
            KnobAxis.of("max_num_batched_tokens", [512 * (j + 1) for j in range(b)]),
        )
    )


def grid_options(configs: int, num_prompts: int, executor: str, csv_path: Path) -> PerfOptions:
    """The grid's options: 16 fixed requests on a simulated H200, two modes, no peers, on `executor`."""
    return PerfOptions(
        workload=WorkloadOptions("fixed", num_prompts=num_prompts, params=("input_len=256,output_len=32",)),
        engine=EngineOptions(
            "llama-3.1-8b", batching=EngineOptions.parse_batching("continuous,static"), knobs=grid_knobs(configs)
        ),
        device=DeviceSpec.checked("sim:h200"),
        backend=BackendOptions(peers=BackendOptions.parse_peers("none")),
        run=RunOptions(executor=parse_executor(executor)),
        output=OutputOptions(output=csv_path, quiet=True),
    )


def time_executor(executor: str, configs: int, num_prompts: int, out: Path) -> tuple[float, list[dict[str, str]]]:
    """`run_plan`'s wall time for the grid on `executor`, and the CSV's cells it wrote."""
    csv_path = out / f"{executor}.csv"
    plan = build_plan(grid_options(configs, num_prompts, executor, csv_path))
    start = time.perf_counter()
    run_plan(plan, Console(file=io.StringIO()), table=False)
    wall = time.perf_counter() - start
    with csv_path.open(newline="") as f:
        cells = [{k: v for k, v in r.items() if k not in RUN_SPECIFIC_COLUMNS} for r in csv.DictReader(f)]
    return wall, cells


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.grid")
    ap.add_argument("--configs", type=int, default=200, help="runs in the grid (rounded up to fill the lists)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--executors", default="serial,pool,ray", help="comma list; serial first: the others' base")
    ap.add_argument("--out", type=Path, default=None, help="where the CSV + JSON of each go (default: a temp dir)")
    a = ap.parse_args(argv)
    if a.configs < 2 or a.num_prompts < 1:
        ap.error("--configs must be >= 2 and --num-prompts >= 1")
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-grid-"))
    out.mkdir(parents=True, exist_ok=True)
    names = [x.strip() for x in a.executors.split(",") if x.strip()]
    walls, cells = {}, {}
    for name in names:
        walls[name], cells[name] = time_executor(name, a.configs, a.num_prompts, out)
        print(f"{name:8s} {len(cells[name]):4d} runs in {walls[name]:7.1f} s", flush=True)
    base = names[0]
    for name in names[1:]:
        same = "same rows" if cells[name] == cells[base] else "ROWS DIFFER"
        print(f"{name}/{base} wall time: {walls[name] / walls[base]:.2f}x ({same} as {base})")
    print(f"files in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
