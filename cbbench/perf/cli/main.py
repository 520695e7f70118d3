"""The `cbbench` command line: perf (the main job), plan (the capacity planner), serve, timeline, plot, report, compare, gate,
generate, kernels, bench-scheduler, bench-step, bench-async.

Every engine knob of `cbbench perf` maps one to one onto a `SchedulerConfig` / `LLMEngine` keyword, and takes a comma
list to sweep (`--max-num-batched-tokens 512,2048`). Bad input (unknown workload, batching mode, knob value) ends
the command with one line on stderr and exit code 2; a regression found by `compare` or `gate` exits 1.

This file holds `perf` and the command table; `perf` lists the options it takes (`PERF_OPTIONS`: each declared
once, in plan/declared.py, and made a typer parameter by params.py), the app and its error handling are in app.py,
the other commands in commands.py and bench_cmd.py. `perf` only parses its options, once, into the typed
`PerfOptions` (plan/options.py): sweep.py does the work.
"""

from __future__ import annotations

import dataclasses

import typer
from rich.console import Console

from cbbench.perf.cli.app import DEBUG_ENV, CliError, app, command_line, err, explicit_params, one_line_errors
from cbbench.perf.cli.bench_cmd import bench_async, bench_scheduler, bench_step
from cbbench.perf.cli.commands import compare, generate, kernels, plot, report, serve, show, timeline
from cbbench.perf.cli.gate_cmd import gate
from cbbench.perf.cli.params import takes
from cbbench.perf.cli.plan_cmd import plan
from cbbench.perf.cli.profile_cmd import bench_profile
from cbbench.perf.cli.sim import make_sim_app
from cbbench.perf.exceptions import NoResultError
from cbbench.perf.knobs import NO_GRID, KnobGrid, engine_knob_options
from cbbench.perf.plan.declared import (
    BACKEND,
    CPU_DEFAULTS,
    DEVICE,
    ENGINE,
    OUTPUT,
    RUN,
    SEED_DATASET_AND_LOAD,
    WORKLOAD,
    Values,
)
from cbbench.perf.plan.options import BackendOptions, PerfOptions

__all__ = ["app", "main", "DEBUG_ENV", "CliError", "run_perf"]


# `cbbench perf`'s options, in --help order (each declared once, in plan/declared.py); the engine knobs follow them
PERF_OPTIONS = (
    WORKLOAD.workload,
    ENGINE.model,
    DEVICE.device,
    ENGINE.dtype,
    WORKLOAD.num_prompts,
    *SEED_DATASET_AND_LOAD,
    BACKEND.backend,
    BACKEND.base_url,
    WORKLOAD.tokenizer,
    BACKEND.prompt_format,
    BACKEND.request_timeout,
    BACKEND.client_workers,
    BACKEND.ignore_eos,
    BACKEND.prefix_cache_isolation,
    ENGINE.batching,
    RUN.repeats,
    RUN.warmup,
    BACKEND.peers,
    OUTPUT.metric_percentiles,
    OUTPUT.goodput,
    OUTPUT.result_dir,
    WORKLOAD.workload_param,
    RUN.cpu_threads,
    OUTPUT.quiet,
    OUTPUT.format,
    OUTPUT.steady_state,
    OUTPUT.output,
    OUTPUT.label,
    OUTPUT.resume,
    RUN.like,
    RUN.dry_run,
    RUN.executor,
)
# what `perf --like` lets the command line set: how to run, where to write, not what to run
LIKE_MAY_SET = frozenset(o.name for o in PERF_OPTIONS if o.with_like)


@one_line_errors("perf")
@engine_knob_options(
    sweep=True,
    exclude=("batching",),
    help={
        "max_num_seqs": f"most requests in a batch; also the HF static batch size and hf-cb's in-flight cap "
        f"(CPU default {CPU_DEFAULTS['max_num_seqs']})"
    },
)
@takes(PERF_OPTIONS)
def perf(ctx: typer.Context, *, values: Values, knobs: KnobGrid = NO_GRID) -> None:
    """Replay a workload through every batching mode (and the peers); print the table, write CSV + JSON."""
    goodput_items, workload_params = list(values.every(OUTPUT.goodput)), list(values.every(WORKLOAD.workload_param))
    for extra in ctx.args:  # `--goodput ttft:500 tpot:50` / `--workload-param a=1 b=2`, as vLLM's nargs options
        if "=" in extra:
            workload_params.append(extra)
        elif ":" in extra:
            goodput_items.append(extra)
        else:
            raise CliError(f"unexpected argument {extra!r}")
    values = values.with_value(OUTPUT.goodput, goodput_items).with_value(WORKLOAD.workload_param, workload_params)
    explicit = explicit_params(ctx)
    like = values[RUN.like]
    if like is not None:  # the configurations are the baseline's; only how to run them may be given
        given = [name for name in explicit if name not in LIKE_MAY_SET]
        if given:
            raise CliError(f"--like takes the configurations from {like}; leave out --{given[0].replace('_', '-')}")
    from cbbench.perf.backends.registry import check_backend  # (the backends load numpy: not at --help)

    # (each group checks its own values, in the order the options are documented to fail: the backend first)
    backend = check_backend(BackendOptions.of(values))
    opts = PerfOptions.of(values, knobs, command_line(ctx), backend)
    if like is not None:  # the repeats, warm-up and threads not given are the baseline's
        run = opts.run
        run = dataclasses.replace(
            run,
            repeats=run.repeats if RUN.repeats.name in explicit else None,
            warmup=run.warmup if RUN.warmup.name in explicit else None,
            cpu_threads=run.cpu_threads if RUN.cpu_threads.name in explicit else None,
        )
        opts = dataclasses.replace(opts, run=run)
    if values[RUN.dry_run]:
        from cbbench.perf.sweep import show_plan  # (brings in aiohttp, numpy)

        show_plan(opts, Console(soft_wrap=True))  # a piped line (a result path) is never broken
    else:
        try:
            run_perf(opts, Console(soft_wrap=True))  # the table fits the terminal; a piped line is never broken
        except NoResultError as e:  # a benchmark that measured nothing never passes; the files are written
            err.print(f"cbbench perf: error: {e}", markup=False)
            raise typer.Exit(1) from None


def run_perf(opts: PerfOptions, console: Console) -> None:
    """sweep.run_perf, imported on first use: the sweep pulls in pandas and the backends, which --help never needs."""
    from cbbench.perf.sweep import run_perf as run  # (brings in aiohttp, numpy)

    run(opts, console)


def run_command_line(argv: list[str]) -> None:
    """A `cbbench` command line (["perf", ...]) in this process, raising on failure: how `cbbench sim validate` runs
    each row's, handed down to it (cli/sim.py), in a worker process too."""
    typer.main.get_command(app).main(args=argv, standalone_mode=False)


# The command table, in --help order. perf stays here, where it finds `run_perf` (tests replace it on this module).
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})(perf)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})(plan)
app.command()(serve)
app.command()(timeline)
app.command()(plot)
app.command()(report)
app.command()(show)
app.command()(compare)
app.command()(gate)
app.command()(generate)
app.command()(kernels)
app.command("bench-scheduler")(bench_scheduler)
app.command("bench-profile")(bench_profile)
app.command("bench-step")(bench_step)
app.command("bench-async")(bench_async)
app.add_typer(make_sim_app(run_command_line), name="sim")


def main() -> None:  # pragma: no cover
    app()
