"""`cbbench plan`: the capacity planner. Given a workload, an SLO and a device, it searches max_num_seqs x
max_num_batched_tokens x tensor_parallel_size x batching mode through the grid executor, writes the CSV + JSON
as `cbbench perf` does (so `cbbench report` draws the frontier), and prints the best configuration per GPU, the
throughput-per-GPU against TPOT p99 frontier, and the runs that miss the SLO with by how much (results/frontier.py).

The search lists default to `DEFAULT_SEARCH`; a tensor-parallel size that the device cannot take is dropped from
the default list with a note, and refused when asked for by name. The grid is capped at `MAX_PLAN_RUNS` runs. The
SLO is also passed on as vLLM's goodput (`--goodput ttft:MS tpot:MS`), so each row carries its request_goodput.
A simulated GPU plans in minutes; a real device works too, run by run (serially), at its real speed.
"""

from __future__ import annotations

import dataclasses
import math

from rich.console import Console

from cbbench.perf.exceptions import NoResultError
from cbbench.perf.grid.build import build_plan
from cbbench.perf.knobs import KnobAxis
from cbbench.perf.plan.options import DEFAULT_MODEL, SIM_MODEL, Listed, OutputOptions, PerfOptions
from cbbench.perf.results.frontier import FRONTIER_LATENCY, Slo, summary_lines
from cbbench.perf.results.rows import read_rows
from cbbench.perf.sweep import run_plan, show_plan
from refengine.sim.sim_device import DeviceSpec, SimDevice

# vLLM-scale defaults: its own max_num_seqs (256) and token budgets (2048 online, 8192 / 16384 offline) bracketed
DEFAULT_SEARCH = (
    KnobAxis.of("max_num_seqs", (64, 128, 256, 512)),
    KnobAxis.of("max_num_batched_tokens", (2048, 8192, 16384)),
)
DEFAULT_TP = (1, 2, 4, 8)
DEFAULT_BATCHING = "continuous,sequence,static"  # `none` serves one request at a time: no capacity to plan
MAX_PLAN_RUNS = 512  # 4 x 3 x 4 x 3 = 144 by default; past this a typo in a list would run for hours
SEARCHED = ("max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size")


def supported_tp(
    device: DeviceSpec, model: str, dtype: str | None, sizes: tuple[int, ...]
) -> tuple[list[int], dict[int, str]]:
    """The tensor-parallel sizes the device can run `model` at, and why each other one is refused."""
    ok, refused = [], {}
    for tp in sizes:
        if not device.tensor_parallel_ok:
            if tp != 1:
                refused[tp] = f"tensor_parallel_size={tp}: refengine's forward runs on one device (sim:<gpu> only)"
                continue
        else:
            try:
                SimDevice.create(device.name, model, dtype, tp)
            except ValueError as e:
                refused[tp] = str(e)
                continue
        ok.append(tp)
    return ok, refused


def plan_options(o: PerfOptions, slo: Slo, given: set[str]) -> tuple[PerfOptions, list[str]]:
    """`o` with the planner's search filled in (`given`: the search options named on the command line), and the
    notes on what was left out; ValueError naming the option for a search that cannot run."""
    notes: list[str] = []
    grid = o.engine.knobs
    for axis in DEFAULT_SEARCH:
        if grid.axis(axis.name) is None:
            grid = grid.with_axis(axis)
    tp_axis = grid.axis("tensor_parallel_size")
    sizes = tuple(int(v) for v in tp_axis.values) if tp_axis is not None else DEFAULT_TP
    model = o.engine.model or (SIM_MODEL if o.device.simulated else DEFAULT_MODEL)
    ok, refused = supported_tp(o.device, model, o.engine.dtype, sizes)
    if refused and ("tensor_parallel_size" in given or not ok):
        raise ValueError(next(iter(refused.values())))
    if refused:
        reason = next(iter(refused.values())).split(": ", 1)[-1]
        notes.append(
            f"tensor_parallel_size {','.join(map(str, refused))} left out ({reason}); searched {','.join(map(str, ok))}"
        )
    grid = grid.with_axis(KnobAxis.of("tensor_parallel_size", ok))
    load = o.load
    for name, text in (
        ("request_rate", load.request_rate.text),
        ("burstiness", load.burstiness.text),
        ("max_concurrency", load.max_concurrency.text),
    ):
        if "," in str(text or ""):
            raise ValueError(f"{name}: cbbench plan takes one value (the load the SLO holds at)")
    if str(load.request_rate.text).strip().lower() == "inf" and load.max_concurrency.text is None:
        notes.append(
            "every request arrives at t0 (--request-rate inf): TTFT p99 is mostly queueing; give the "
            "serving load with --request-rate (or --max-concurrency) for an online SLO"
        )
    goodput = tuple(f"{k}:{v:g}" for k, v in (("ttft", slo.ttft_p99_ms), ("tpot", slo.tpot_p99_ms)) if v is not None)
    lists = {n: searched.values for n in SEARCHED if (searched := grid.axis(n)) is not None}
    modes = o.engine.batching.values
    runs = math.prod(len(v) for v in lists.values()) * len(modes)
    if runs > MAX_PLAN_RUNS:
        shape = " x ".join(f"{n} {len(v)}" for n, v in lists.items()) + f" x batching {len(modes)}"
        raise ValueError(
            f"plan: the search is {runs} runs ({shape}), over MAX_PLAN_RUNS={MAX_PLAN_RUNS}; shorten a list"
        )
    o = dataclasses.replace(
        o,
        engine=dataclasses.replace(o.engine, knobs=grid),
        backend=dataclasses.replace(o.backend, peers=Listed((), "none")),
        run=dataclasses.replace(o.run, repeats=1),
        output=dataclasses.replace(o.output, goodput_items=goodput, goodput=OutputOptions.parse_goodput(goodput)),
    )
    return o, notes


def run_capacity_plan(o: PerfOptions, slo: Slo, given: set[str], console: Console, *, dry_run: bool = False) -> None:
    """The whole `cbbench plan`: search, write, summarise (NoResultError after the summary when a run failed)."""
    o, notes = plan_options(o, slo, given)
    if dry_run:
        show_plan(o, console)
        for line in notes:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    plan = build_plan(o)
    plan.config["capacity_plan"] = {**slo.as_config(), "frontier_latency": FRONTIER_LATENCY}
    failed: NoResultError | None = None
    try:
        run_plan(plan, console, table=False)
    except NoResultError as e:  # the other runs are planned on all the same; the command still fails after
        failed = e
    rows = read_rows(plan.csv_path, allow_empty=True)
    for line in notes + summary_lines(rows, slo):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if failed is not None:
        raise failed
