"""`cbbench perf`: build the plan, run it, write the results (CSV + JSON, each run as it finishes), print the table.

`run_perf` is the whole command: `build_plan` (grid/build.py) turns the options into a validated `RunPlan` once,
`run_plan` runs its specs through their backends, writing each result as it finishes (`results/writer.py`), and
`report/table.py` prints the table.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from contextlib import closing
from urllib.parse import urlsplit

from rich.console import Console

from cbbench.perf.backends.backend import RunResult
from cbbench.perf.exceptions import NoResultError
from cbbench.perf.grid.build import RunPlan, build_plan
from cbbench.perf.grid.order import plan_positions, put_in_plan_order, row_position
from cbbench.perf.grid.run import Grid
from cbbench.perf.plan.executor import resolve_executor
from cbbench.perf.plan.options import DEFAULT_CPU_THREADS, PerfOptions
from cbbench.perf.plan.spec import RunSpec
from cbbench.perf.report.show import labels_of_rows, render
from cbbench.perf.report.table import Entry
from cbbench.perf.report.table_title import cell_number
from cbbench.perf.results.environment import environment_info
from cbbench.perf.results.schema import make_row
from cbbench.perf.results.writer import ResultWriter
from refengine.sim.sim_models import sim_model


def run_perf(o: PerfOptions, console: Console) -> list[Mapping[str, object]]:
    """The whole `cbbench perf` job: plan -> run -> write; returns the CSV rows."""
    return run_plan(build_plan(o), console)


def show_plan(o: PerfOptions, console: Console) -> None:
    """`cbbench perf --dry-run`: the validated plan, one line per run, and the executor; nothing runs."""
    plan = build_plan(o)
    head, _, runs = plan.describe().partition("\n")
    choice = resolve_executor(plan.executor, plan.settings.device, plan.server, len(plan.specs))
    text = f"{head}; executor {choice.describe(len(plan.specs))}" + (f"\n{runs}" if runs else "")
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def run_plan(plan: RunPlan, console: Console, *, table: bool = True) -> list[Mapping[str, object]]:
    """Run every spec not already in the output (`--resume`) on the plan's executor (perf/grid/), write each result
    as it finishes, put the files in plan order, print the table (unless `table` is False: `cbbench plan`)."""
    _set_threads(plan)
    _check_server(plan.settings.base_url)
    _check_simulated_tp(plan)
    for backend in plan.backends.values():  # (a server's offer is asked once, before any file is written)
        backend.prepare()
    writer = ResultWriter(
        plan.csv_path,
        config=plan.config,
        environment=environment_info(plan.settings.device.name),
        workload=plan.workload,
        resume=plan.resume,
    )
    todo = [i for i, spec in enumerate(plan.specs) if not writer.done(spec.plan_id)]
    grid = Grid(plan, resolve_executor(plan.executor, plan.settings.device, plan.server, len(todo)), todo)
    info = console if plan.format == "text" else Console(stderr=True)  # stdout holds only the markdown / JSON
    if plan.resume and writer.num_done:
        info.print(f"resume: {writer.num_done} run(s) already in {plan.csv_path}; {len(todo)} to go", markup=False)
    # the table covers the whole file: the runs saved before the interruption, named as they were, then the new,
    # all in plan order however they finished
    positions = plan_positions(plan)
    entries: list[tuple[tuple[int, int], Entry]] = [
        (row_position(row, positions, k), (key, row, None))
        for k, (key, row) in enumerate(zip(labels_of_rows(writer.rows, writer.row_labels()), writer.rows))
    ]
    notes: list[str] = []
    speed: list[tuple[str, float, float]] = []  # simulated runs: (run, simulated seconds, wall seconds)
    try:
        with grid.progress(console) as progress, closing(grid.outcomes(progress)) as outcomes:
            for out in outcomes:  # closing: a raise here stops the workers at once
                if out.exception is not None:  # a worker's run raised: as the same run would raise here
                    raise out.exception
                spec, result = plan.specs[out.index], out.result
                assert result is not None  # an outcome holds a result or the exception raised above
                entries.append(((0, out.index), _record(plan, spec, result, writer, notes)))
                progress.finish(entries[-1][1][1], entries[-1][1][2])
                if plan.settings.device.simulated and not result.error:
                    speed.append((spec.describe(), result.duration, out.wall_s))
    except KeyboardInterrupt:
        writer.finish()
        raise KeyboardInterrupt(
            f"{writer.num_done} run(s) kept in {plan.csv_path}; add --output {plan.csv_path} --resume to finish"
        ) from None
    if speed:
        notes.append(_speed_note(speed, writer))
    if not put_in_plan_order(writer, plan):
        writer.finish()
    entries.sort(key=lambda e: e[0])
    if table:
        render(
            console,
            [e for _, e in entries],
            plan.workload,
            plan.format,
            goodput=plan.goodput,
            steady_state=plan.steady_state,
        )
    for line in dict.fromkeys(notes + grid.notes):  # a note every run of a server makes is said once
        info.print(line, markup=False, highlight=False, soft_wrap=True)  # a log's line is never broken
    info.print(f"wrote {plan.csv_path}, {writer.json_path} and {writer.files.root}/", markup=False, soft_wrap=True)
    _check_measured([e for _, e in entries])
    return writer.rows


def _check_measured(entries: list[Entry]) -> None:
    """NoResultError naming the first run that produced no result or completed no request, after the table and
    the files are written (the runs that did finish are kept)."""
    for (engine, batching, label), row, error in entries:
        name = " ".join(x for x in (engine, batching, label) if x and x != "-")
        if row is None:
            raise NoResultError(f"{name} produced no result: {str(error).strip().splitlines()[0] if error else '?'}")
        completed, failed = (cell_number(row.get(k) or 0) for k in ("completed", "failed"))  # resumed: text
        if not completed:
            raise NoResultError(f"{name}: every request failed ({failed:.0f} of {failed + completed:.0f})")


def _record(plan: RunPlan, spec: RunSpec, result: RunResult, writer: ResultWriter, notes: list[str]) -> Entry:
    """One finished run: its row and records written; its entry of the table (key, row or None, error)."""
    key = (result.engine, result.batching, spec.label_of(result.knobs))
    if result.error:
        return key, None, result.error
    backend = plan.backends[spec.backend]
    config, device = backend.row_config(result)
    notes += backend.notes(key, result)
    row = make_row(
        metrics=result.metrics(metric_percentiles=plan.percentiles, goodput=plan.goodput),
        engine=result.engine,
        workload=spec.workload,
        batching=result.batching,
        config=config,
        repeat=spec.repeat,
        model=plan.settings.model,
        device=device,
        git_sha=sha if isinstance(sha := writer.environment["git_sha"], str) else None,
        label=plan.label,
        command=plan.command,
        run_options={**plan.run_options, "plan_id": spec.plan_id},
    )
    label = f"{result.engine}/{result.batching}/{key[2]}/repeat{spec.repeat}"
    writer.add(row, label, result.records, result.steps, server_series=getattr(result, "server_series", None))
    return key, row, None


def _speed_note(speed: list[tuple[str, float, float]], writer: ResultWriter) -> str:
    """How much faster than real time the simulation ran, in worker time: the runs' own wall times added up (runs on
    a pool overlap, so this exceeds the grid's elapsed time, which the executor's note gives). Also kept in the
    JSON's config (wall time is the host's, so it is never a CSV metric: a gate would see the machine's load)."""
    sim, wall = sum(s for _, s, _ in speed), sum(w for _, _, w in speed)
    writer.config["sim_speed"] = {
        "simulated_s": sim,
        "wall_s": wall,
        "runs": {name: {"simulated_s": s, "wall_s": w} for name, s, w in speed},
    }
    return (
        f"simulated {sim:.1f} s of GPU time in {wall:.1f} s of worker time (each run's wall time, added up over the"
        f" runs; {sim / wall:.2f} simulated s per worker s)"
    )


def _check_simulated_tp(plan: RunPlan) -> None:
    """A simulated GPU splits a model only over the tensor-parallel sizes its measured tables cover: refused here,
    before any run starts or the executor is named (a worker would refuse it only once the grid is under way)."""
    if not plan.settings.device.simulated:
        return
    sizes = {tp for spec in plan.specs if (tp := spec.knobs.tensor_parallel_size) is not None}
    if sizes - {1}:
        shape = sim_model(plan.settings.model)[1]
        for tp in sorted(sizes):
            shape.check_tp(tp)


SERVER_CONNECT_TIMEOUT_S = 5.0  # a server that takes longer to accept a connection is not there for a benchmark


def _check_server(base_url: str | None) -> None:
    """A server backend's address must accept a connection before anything runs or is written: with no server
    there, every request would fail and the CSV and JSON would hold a run that never started (ValueError: exit 2)."""
    if not base_url:
        return

    url = urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=SERVER_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        why = "connection refused" if isinstance(e, ConnectionRefusedError) else (e.strerror or type(e).__name__)
        raise ValueError(
            f"--base-url {base_url}: no server answers there ({why}); start one (`cbbench serve`) or fix the address"
        ) from None


def _set_threads(plan: RunPlan) -> None:
    st = plan.settings
    if st.device.is_cpu and st.cpu_threads != 0:
        import torch  # (a CPU run loads the engine, and torch with it, anyway; a simulated one never does)

        torch.set_num_threads(st.cpu_threads or DEFAULT_CPU_THREADS)  # the same default as `serve`
