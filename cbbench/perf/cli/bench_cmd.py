"""The `cbbench bench-*` commands: the scheduler's, the engine step's and async scheduling's benchmarks, printed
as plain-text tables (perf/bench/scheduler_cost.py, step.py, async_engine.py do the measuring)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from cbbench.perf.cli.app import CliError, Opt, one_line_errors
from cbbench.perf.knobs import list_metavar


@one_line_errors("bench-scheduler")
def bench_scheduler(
    running: Annotated[
        str, Opt(help="comma list of running decode counts", metavar=list_metavar("int"))
    ] = "32,256,1024",
    iters: Annotated[int, Opt(help="timed steps per size")] = 200,
) -> None:
    """Microseconds per schedule() + update_from_output() step with N running decodes (model-free)."""
    from cbbench.perf.bench.scheduler_cost import bench_step_us  # (the command's work: not at --help)

    sizes = _ints("running", running)
    if not sizes or min(sizes) < 1:
        raise CliError(f"running: expected a comma list of integers >= 1, got {running!r}")
    if iters < 1:
        raise CliError(f"iters must be >= 1, got {iters}")
    console = Console()
    for n in sizes:
        s = bench_step_us(n, iters=iters)
        console.print(
            f"{n:>5} running decodes: median {s['median_us']:8.1f} us/step  "
            f"(p90 {s['p90_us']:.1f}, min {s['min_us']:.1f})"
        )


# bench-step's options whose help runs long, named here so that the command reads one line per option
_StubModel = Annotated[
    bool,
    Opt(
        "--stub-model/--real-model",
        help="replace the forward by a stub that returns at once (host time only), or run the real model",
    ),
]
_CpuThreads = Annotated[
    int,
    Opt(
        help="torch threads (default 1: the host work is one Python thread, and one "
        "torch thread keeps a shared CPU's timings stable; 0 = torch's default)"
    ),
]
_Detokenizer = Annotated[
    str,
    Opt(
        help="incremental (the engine's), or full-redecode (the whole output decoded "
        "every step, as before: the before/after comparison)"
    ),
]
_OutputKind = Annotated[
    str,
    Opt(
        help="what step() returns per request (SamplingParams.output_kind): delta (every "
        "step's new tokens and text, as a streaming server needs), cumulative, or "
        "final_only (nothing until a request finishes, as LLM.generate)"
    ),
]


@one_line_errors("bench-step")
def bench_step(
    stub_model: _StubModel = False,
    running: Annotated[str, Opt(help="comma list of running decode counts", metavar=list_metavar("int"))] = "64,256",
    iters: Annotated[int, Opt(help="timed steps per size")] = 100,
    warmup: Annotated[int, Opt(help="untimed steps first")] = 5,
    model: Annotated[str, Opt()] = "tiny-qwen2",
    device: Annotated[str, Opt()] = "cpu",
    stop: Annotated[
        Optional[list[str]], Opt(help="stop strings every request carries (never met)", metavar="<str>")
    ] = None,
    cpu_threads: _CpuThreads = 1,
    breakdown: Annotated[
        bool, Opt(help="also the CPU time of schedule / execute_model / update_from_output / the rest (outputs)")
    ] = False,
    detokenizer: _Detokenizer = "incremental",
    output_kind: _OutputKind = "delta",
    mixed_prompt_len: Annotated[
        int,
        Opt(
            help="also time mixed steps (the N decodes beside one prefill of this many tokens) against decode-only "
            "ones, alternating, and print the host-time ratio (0: not)"
        ),
    ] = 0,
) -> None:
    """Microseconds per whole engine step (schedule, forward, sampling, update, outputs) at N running decodes.

    It times schedule, input preparation, forward, sampling, update_from_output, detokenisation and outputs; with
    --stub-model the forward costs nothing, so this is the engine's host time."""
    import torch

    from cbbench.perf.bench.step import bench_engine_step_us, format_breakdown, format_table  # (brings in torch, numpy)

    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    sizes = _ints("running", running)
    if not sizes or min(sizes) < 1 or iters < 1 or warmup < 0:
        raise CliError("running must list positive counts, iters must be >= 1 and warmup >= 0")
    rows = [
        bench_engine_step_us(
            n,
            iters=iters,
            warmup=warmup,
            model=model,
            device=device,
            stub=stub_model,
            stop=stop,
            breakdown=breakdown,
            detokenizer=detokenizer,
            output_kind=output_kind,
        )
        for n in sizes
    ]
    typer.echo(
        f"engine step, {'stub' if stub_model else 'real'} model {model} on {device}, {detokenizer} "
        f"detokenizer, {output_kind} outputs, {iters} timed steps each"
    )
    typer.echo(format_table(rows))  # plain text: a table must not wrap at a narrow terminal's width
    if breakdown:
        typer.echo("median CPU us per step, by phase (outputs: stop strings, detokenisation, RequestOutputs, stats):")
        typer.echo(format_breakdown(rows))
    if mixed_prompt_len:
        from cbbench.perf.bench.step import bench_mixed_step_us, format_mixed_table  # (brings in torch, numpy)

        if mixed_prompt_len < 2:
            raise CliError("mixed-prompt-len must be 0 (off) or >= 2")
        mixed = [
            bench_mixed_step_us(n, mixed_prompt_len, iters, warmup, model=model, device=device, stub=stub_model)
            for n in sizes
        ]
        typer.echo(f"host us per step, decode-only vs mixed (one {mixed_prompt_len}-token prefill beside the decodes):")
        typer.echo(format_mixed_table(mixed))


@one_line_errors("bench-async")
def bench_async(
    num_requests: Annotated[int, Opt(help="requests, all added at once")] = 32,
    prompt_len: Annotated[int, Opt(help="prompt tokens per request")] = 64,
    max_tokens: Annotated[int, Opt(help="output tokens per request (ignore_eos)")] = 64,
    repeats: Annotated[int, Opt(help="timed runs per mode, alternating")] = 3,
    max_num_seqs: Annotated[int, Opt(help="most requests in a batch")] = 256,
    device_ms: Annotated[
        Optional[float],
        Opt(
            help="replace the forward by a stub that sleeps this long (device time "
            "that needs no host CPU, as a GPU's); default: the real model"
        ),
    ] = None,
    model: Annotated[str, Opt()] = "tiny-qwen2",
    device: Annotated[str, Opt()] = "cpu",
    cpu_threads: Annotated[
        int,
        Opt(
            help="torch threads (default 1: the forward on one core, the host work of the "
            "other step beside it; 0 = torch's default)"
        ),
    ] = 1,
) -> None:
    """Throughput of one workload with async scheduling off and on, same process, and the ratio on / off."""
    import torch

    from cbbench.perf.bench.async_overlap import bench_async as run  # (brings in torch, numpy)
    from cbbench.perf.bench.async_overlap import format_table  # (brings in torch, numpy)

    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    if min(num_requests, prompt_len, max_tokens, repeats, max_num_seqs) < 1 or (device_ms or 0) < 0:
        raise CliError("num-requests, prompt-len, max-tokens, repeats and max-num-seqs must be >= 1, device-ms >= 0")
    rows = run(
        num_requests,
        prompt_len,
        max_tokens,
        repeats,
        model=model,
        device=device,
        max_num_seqs=max_num_seqs,
        device_ms=device_ms,
    )
    forward = "real forward" if device_ms is None else f"stub forward sleeping {device_ms:g} ms"
    typer.echo(
        f"async scheduling, {model} on {device} ({forward}), {num_requests} x ({prompt_len} in, {max_tokens} "
        f"out), {repeats} runs per mode, torch threads {torch.get_num_threads()}"
    )
    typer.echo(format_table(rows))


def _ints(name: str, text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{name}: expected a comma list of integers, got {text!r}") from None
