"""The `cbbench` command line: perf (the main job), plan (the capacity planner), serve, timeline, plot, report, compare, gate,
generate, kernels, bench-scheduler, bench-step, bench-async.

Every engine knob of `cbbench perf` maps one to one onto a `SchedulerConfig` / `LLMEngine` keyword, and takes a comma
list to sweep (`--max-num-batched-tokens 512,2048`). Bad input (unknown workload, batching mode, knob value) ends
the command with one line on stderr and exit code 2; a regression found by `compare` or `gate` exits 1.

This file holds `perf` and the command table; `perf`'s options are declared in perf_params.py, the app and its
error handling are in app.py, the other commands in commands.py and bench_cmd.py. `perf` only parses its options,
once, into the typed `PerfOptions` (plan/options.py): sweep.py does the work.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from cbbench.perf.cli import perf_params as options
from cbbench.perf.cli.app import (
    DEBUG_ENV,
    LIKE_MAY_SET,
    CliError,
    app,
    command_line,
    err,
    explicit_params,
    one_line_errors,
)
from cbbench.perf.cli.bench_cmd import bench_async, bench_scheduler, bench_step
from cbbench.perf.cli.commands import compare, generate, kernels, plot, report, serve, show, timeline
from cbbench.perf.cli.gate_cmd import gate
from cbbench.perf.cli.plan_cmd import plan
from cbbench.perf.cli.profile_cmd import bench_profile
from cbbench.perf.cli.sim import make_sim_app
from cbbench.perf.exceptions import NoResultError
from cbbench.perf.knobs import NO_GRID, KnobGrid, engine_knob_options
from cbbench.perf.plan.options import (
    CPU_DEFAULTS,
    BackendOptions,
    ClientOptions,
    EngineOptions,
    LoadAxes,
    OutputOptions,
    PerfOptions,
    RunOptions,
    WorkloadOptions,
)
from refengine.sim.sim_device import DeviceSpec

__all__ = ["app", "main", "DEBUG_ENV", "CliError", "run_perf"]


@one_line_errors("perf")
@engine_knob_options(
    sweep=True,
    exclude=("batching",),
    help={
        "max_num_seqs": f"most requests in a batch; also the HF static batch size and hf-cb's in-flight cap "
        f"(CPU default {CPU_DEFAULTS['max_num_seqs']})"
    },
)
def perf(
    ctx: typer.Context,
    workload: options.Workload = "sharegpt",
    model: options.Model = None,
    device: options.Device = "cpu",
    dtype: options.Dtype = None,
    num_prompts: options.NumPrompts = None,
    seed: options.Seed = 0,
    dataset_path: options.DatasetPath = None,
    time_scale: options.TimeScale = None,
    hf_split: options.HfSplit = None,
    hf_column: options.HfColumn = None,
    hf_output_column: options.HfOutputColumn = None,
    hf_output_len: options.HfOutputLen = None,
    max_prompt_len: options.MaxPromptLen = None,
    max_output_len: options.MaxOutputLen = None,
    request_rate: options.RequestRate = "inf",
    burstiness: options.Burstiness = "1",
    max_concurrency: options.MaxConcurrency = None,
    backend: options.Backend = "refengine",
    base_url: options.BaseUrl = None,
    tokenizer: options.Tokenizer = None,
    prompt_format: options.PromptFormat = "ids",
    request_timeout: options.RequestTimeout = 6 * 3600,
    client_workers: options.ClientWorkers = 1,
    ignore_eos: options.IgnoreEos = True,
    prefix_cache_isolation: options.PrefixCacheIsolation = "auto",
    batching: options.Batching = "continuous,sequence,static,none",
    repeats: options.Repeats = None,
    warmup: options.Warmup = 8,
    peers: options.Peers = "hf-static,hf-cb",
    metric_percentiles: options.MetricPercentiles = "50,90,99",
    goodput: options.Goodput = None,
    result_dir: options.ResultDir = Path("results"),
    workload_param: options.WorkloadParam = None,
    cpu_threads: options.CpuThreads = None,
    quiet: options.Quiet = False,
    format: options.Format = "text",
    steady_state: options.SteadyState = False,
    output: options.Output = None,
    label: options.Label = "",
    resume: options.Resume = False,
    like: options.Like = None,
    dry_run: options.DryRun = False,
    executor: options.Executor = None,
    knobs: KnobGrid = NO_GRID,
) -> None:
    """Replay a workload through every batching mode (and the peers); print the table, write CSV + JSON."""
    goodput_items, workload_params = list(goodput or []), list(workload_param or [])
    for extra in ctx.args:  # `--goodput ttft:500 tpot:50` / `--workload-param a=1 b=2`, as vLLM's nargs options
        if "=" in extra:
            workload_params.append(extra)
        elif ":" in extra:
            goodput_items.append(extra)
        else:
            raise CliError(f"unexpected argument {extra!r}")
    explicit = explicit_params(ctx)
    if like is not None:  # the configurations are the baseline's; only how to run them may be given
        given = [name for name in explicit if name not in LIKE_MAY_SET and name != "executor"]  # how, not what
        if given:
            raise CliError(f"--like takes the configurations from {like}; leave out --{given[0].replace('_', '-')}")
    from cbbench.perf.backends.registry import check_backend  # (the backends load numpy: not at --help)

    opts = PerfOptions(  # (each group checks its own values, in the order the options are documented to fail)
        backend=check_backend(
            BackendOptions(
                name=backend,
                client=ClientOptions(
                    base_url, prompt_format, ignore_eos, request_timeout, client_workers, prefix_cache_isolation
                ),
                peers=BackendOptions.parse_peers(peers),
            )
        ),
        output=OutputOptions(
            result_dir=result_dir,
            output=output,
            label=label,
            resume=resume,
            format=format,
            steady_state=steady_state,
            quiet=quiet,
            metric_percentiles=OutputOptions.parse_percentiles(metric_percentiles),
            goodput_items=tuple(goodput_items),
            goodput=OutputOptions.parse_goodput(goodput_items),
            command=command_line(ctx),
        ),
        engine=EngineOptions(model=model, dtype=dtype, batching=EngineOptions.parse_batching(batching), knobs=knobs),
        device=DeviceSpec.checked(device),
        run=RunOptions(  # --like: the repeats, warm-up and threads not given are the baseline's
            seed=seed,
            repeats=repeats if like is None or "repeats" in explicit else None,
            warmup=warmup if like is None or "warmup" in explicit else None,
            cpu_threads=cpu_threads if like is None or "cpu_threads" in explicit else None,
            executor=RunOptions.parse_executor(executor),
        ),
        workload=WorkloadOptions(
            name=workload,
            num_prompts=num_prompts,
            dataset_path=dataset_path,
            max_prompt_len=max_prompt_len,
            max_output_len=max_output_len,
            time_scale=time_scale,
            hf_split=hf_split,
            hf_column=hf_column,
            hf_output_column=hf_output_column,
            hf_output_len=hf_output_len,
            tokenizer=tokenizer,
            params=tuple(workload_params),
        ),
        load=LoadAxes.parse(request_rate, burstiness, max_concurrency),
        like=like,
    )
    if dry_run:
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
