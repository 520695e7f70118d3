"""The `cbbench` commands around perf: serve, timeline, plot, report, compare, generate, kernels.

Each is a plain function wrapped by `one_line_errors`; cli/main.py registers them on the app, in --help order.
Heavy modules (the engine, matplotlib, the server) are imported inside the command that needs them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from cbbench.perf.cli.app import CliError, Opt, err, one_line_errors
from cbbench.perf.knobs import NO_KNOBS, EngineKnobs, engine_knob_options, list_metavar
from cbbench.perf.plan.options import DEFAULT_CPU_THREADS, EngineOptions
from refengine.entrypoints.address import bind_socket, check_shutdown_timeout
from refengine.sim.sim_device import DeviceSpec


@one_line_errors("serve")
@engine_knob_options(sweep=False)
def serve(
    model: Annotated[str, Opt(help="a preset name or a local Hugging Face folder")] = "tiny-qwen2",
    host: Annotated[str, Opt(help="127.0.0.1: this machine only; 0.0.0.0 exposes the server")] = "127.0.0.1",
    port: Annotated[int, Opt(help="the TCP port to listen on (1-65535), on --host")] = 8000,
    served_model_name: Annotated[Optional[str], Opt(help='the name clients send as "model" (default: --model)')] = None,
    device: Annotated[str, Opt(help="the engine's device: cpu, cuda[:N], or a simulated GPU sim:<gpu>")] = "cpu",
    dtype: Annotated[Optional[str], Opt(help="default: float32 on CPU, bfloat16 on CUDA")] = None,
    seed: Annotated[int, Opt(help="the engine's seed: a preset's random weights and seeded sampling")] = 0,
    cpu_threads: Annotated[
        Optional[int], Opt(help="torch threads on CPU (default 1, as in-process perf's; 0 = torch's default)")
    ] = None,
    log_level: Annotated[str, Opt(help="uvicorn's: critical | error | warning | info | debug")] = "info",
    api_key: Annotated[
        Optional[str],
        Opt(help="require `Authorization: Bearer KEY` (default: $VLLM_API_KEY); /health and /metrics stay open"),
    ] = None,
    disable_fastapi_docs: Annotated[bool, Opt(help="no /docs and no /openapi.json")] = False,
    shutdown_timeout: Annotated[
        float, Opt(help="on SIGTERM, seconds the requests in flight get to finish before they are aborted")
    ] = 5.0,
    knobs: EngineKnobs = NO_KNOBS,
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /metrics)."""
    knobs.validate()  # every check that needs no model, before the server and the engine load torch
    engine_kwargs = {"model": model, "device": device, "dtype": dtype, "seed": seed, **knobs.given()}
    if cpu_threads is not None and cpu_threads < 0:
        raise CliError(f"cpu-threads must be >= 0 (0 = torch's default), got {cpu_threads}")
    check_shutdown_timeout(shutdown_timeout)

    check_api_key(
        *((api_key, "--api-key") if api_key is not None else (os.environ.get("VLLM_API_KEY"), "VLLM_API_KEY"))
    )
    sock = bind_socket(host, port)  # run_server serves on it and closes it
    from refengine.entrypoints.launch import run_server  # (the server and the engine load torch)

    if DeviceSpec.parse(device).is_cpu and cpu_threads != 0:  # the same default as in-process perf
        import torch

        torch.set_num_threads(cpu_threads or DEFAULT_CPU_THREADS)
    run_server(
        engine_kwargs,
        host=host,
        port=port,
        served_model_name=served_model_name,
        log_level=log_level,
        api_key=api_key,
        disable_docs=disable_fastapi_docs,
        shutdown_timeout=shutdown_timeout,
        sock=sock,
    )


def check_api_key(key: str | None, source: str) -> None:
    """CliError unless `key` can arrive in an `Authorization: Bearer KEY` header as it is: visible ASCII, no space. A
    key with a space or a non-ASCII character would start a server that refuses every request (a client cannot send
    it, or its header is cut at the space)."""
    if key is None:
        return
    bad = next((c for c in key if not "\x21" <= c <= "\x7e"), None)
    if not key or bad is not None:
        what = "is empty" if not key else f"holds {bad!r}"
        raise CliError(f"{source}: the API key {what}; a key is visible ASCII with no spaces (it travels in a header)")


@one_line_errors("timeline")
def timeline(
    out: Annotated[Path, Opt(help="PNG to write")] = Path("results/timeline.png"),
    model: Annotated[str, Opt()] = "tiny-qwen2",
    device: Annotated[str, Opt()] = "cpu",
    num_requests: Annotated[int, Opt(help="requests of varied lengths")] = 12,
    max_num_seqs: Annotated[int, Opt(help="slots")] = 4,
    seed: Annotated[int, Opt()] = 0,
    batching: Annotated[
        str, Opt(help="comma list of modes, one panel each", metavar=list_metavar("str"))
    ] = "continuous,sequence,static,none",
) -> None:
    """The batching modes' picture from a real run: which request holds which slot at each step, per batching mode."""
    from cbbench.perf.report.timeline import run_timeline  # (brings in numpy)

    modes = EngineOptions.parse_batching(batching).values
    path, util = run_timeline(
        out, model=model, device=device, num_requests=num_requests, max_num_seqs=max_num_seqs, seed=seed, modes=modes
    )
    Console(soft_wrap=True).print(
        f"wrote {path}  (slot utilisation: " + ", ".join(f"{m} {u:.0%}" for m, u in util.items()) + ")", markup=False
    )


@one_line_errors("plot")
def plot(
    result_csvs: Annotated[list[Path], typer.Argument(help="one or more cbbench perf CSVs", metavar="CSV")],
    label: Annotated[
        Optional[list[str]],
        Opt(help="one per CSV, in order (default: the CSV's label column, else its file name)", metavar="<str>"),
    ] = None,
    kind: Annotated[
        str,
        Opt(
            help="auto | latency (against throughput, across request rates) | sweep (against "
            "--knob); auto picks latency when the CSVs hold several request rates"
        ),
    ] = "auto",
    knob: Annotated[str, Opt(help="the swept column on the x axis (sweep)")] = "max_num_batched_tokens",
    # a str, not a Path: Path drops the trailing slash of `--out plots/`, the sign of a folder to make
    out: Annotated[
        Optional[str], Opt(help="PNG, or a folder (default: next to the first CSV)", metavar="<path>")
    ] = None,
) -> None:
    """Result CSVs as curves with error bars from repeats: latency against throughput, or against a swept knob."""
    from cbbench.perf.report.plot import plot_results  # (brings in pandas)

    Console(soft_wrap=True).print(
        f"wrote {plot_results(result_csvs, labels=label, kind=kind, knob=knob, out=out)}", markup=False
    )


@one_line_errors("report")
def report(
    run_json: Annotated[Path, typer.Argument(help="the JSON a cbbench perf run wrote", metavar="RUN_JSON")],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="HTML file or folder (default: beside the JSON)")] = None,
) -> None:
    """One self-contained HTML page: results table, TTFT / ITL CDFs, slot timelines, environment."""
    from cbbench.perf.report.html import write_report  # (brings in numpy)

    Console(soft_wrap=True).print(f"wrote {write_report(run_json, out)}", markup=False)


@one_line_errors("show")
def show(
    results_csv: Annotated[
        Path,
        typer.Argument(help="a cbbench perf results CSV (its JSON beside it names the runs)", metavar="RESULTS_CSV"),
    ],
    format: Annotated[str, Opt("--format", help="text | markdown | json")] = "text",
    steady_state: Annotated[
        bool,
        Opt(
            "--steady-state",
            help="add the figures over the window where the requests in flight stayed >= 0.95 x their maximum",
        ),
    ] = False,
) -> None:
    """Print the perf table of saved results again: medians over repeats, as the run printed it."""
    from cbbench.perf.report.show import render, saved_entries  # (the command's work: not at --help)

    entries, workload = saved_entries(results_csv)
    render(Console(), entries, workload, format, steady_state=steady_state)


@one_line_errors("compare")
def compare(
    baseline: Annotated[Path, typer.Argument(help="baseline results CSV", metavar="BASELINE")],
    new: Annotated[Path, typer.Argument(help="new results CSV", metavar="NEW")],
    tolerance: Annotated[
        Optional[list[str]],
        Opt(
            help="METRIC=REL (0.2, 20% or off; fnmatch patterns allowed); repeat it for several", metavar="<metric=rel>"
        ),
    ] = None,
    allow_missing: Annotated[bool, Opt(help="a baseline config missing from NEW is not a failure")] = False,
    only_changes: Annotated[bool, Opt(help="hide rows within tolerance")] = False,
    ignore_key: Annotated[
        Optional[list[str]],
        Opt(
            help="key columns not matched on; `server` = all but the model and the load (in-process vs HTTP runs)",
            metavar="<column>",
        ),
    ] = None,
    where: Annotated[
        Optional[list[str]],
        Opt(
            help="KEY=VALUE: compare only the rows of both files that match, "
            "e.g. batching=continuous; repeat it for several",
            metavar="<key=value>",
        ),
    ] = None,
    format: Annotated[str, Opt("--format", help="text | markdown (a CI step summary) | json")] = "text",
    tolerance_files: Annotated[
        bool,
        Opt(
            help="read BASELINE's sidecar NAME.tolerances.toml and the tool.cbbench.tolerances table of pyproject.toml"
        ),
    ] = True,
    on_inconclusive: Annotated[
        str, Opt(help="no regression shown and none ruled out: fail (exit 3) | pass (exit 0)")
    ] = "fail",
) -> None:
    """Per configuration and metric: change, direction, tolerance. Exit 1 on a regression, 2 on bad input, 3 when inconclusive.

    With enough repeats on both sides, the gate's U test decides each metric (its tolerance the minimum effect);
    otherwise a regression is a median worse than the baseline's by more than the tolerance AND every new repeat
    worse than every baseline repeat (see perf/results/compare.py)."""
    from cbbench.perf.results.compare import main_compare, parse_tolerances  # (the command's work: not at --help)

    tol = parse_tolerances(tolerance or [])
    code = main_compare(
        baseline,
        new,
        tol,
        fail_on_missing=not allow_missing,
        only_changes=only_changes,
        ignore_key=ignore_key or [],
        console=Console(width=max(100, Console().width)),
        err=err,
        fmt=format,
        use_tolerance_files=tolerance_files,
        where=where or [],
        on_inconclusive=on_inconclusive,
    )
    raise typer.Exit(code)


@one_line_errors("generate")
def generate(
    prompts: Annotated[list[str], typer.Argument(help="one or more prompts", metavar="PROMPT")],
    model: Annotated[str, Opt()] = "tiny-qwen2",
    device: Annotated[str, Opt()] = "cpu",
    max_tokens: Annotated[int, Opt()] = 16,
    temperature: Annotated[float, Opt()] = 0.0,
) -> None:
    """Generate for a few prompts and print them (random-weight presets print gibberish, by design)."""
    from refengine.entrypoints.llm import LLM  # (loads torch and the model: not at --help)
    from refengine.sampling_params import SamplingParams  # (brings in numpy)

    llm = LLM(model=model, device=device)
    for p, o in zip(prompts, llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=temperature))):
        c = o.outputs[0]
        Console().print(f"[bold]{p!r}[/] -> {c.text!r}  ({len(c.token_ids)} tokens, {c.finish_reason})")


@one_line_errors("kernels")
def kernels(
    out: Annotated[Path, Opt()] = Path("results/kernels.csv"),
    quick: Annotated[bool, Opt(help="a few shapes only")] = False,
    allow_cpu: Annotated[
        bool,
        Opt(
            help="without CUDA: a tiny smoke run under TRITON_INTERPRET "
            "(checks the bookkeeping; its timings mean nothing)"
        ),
    ] = False,
) -> None:
    """Attention kernels against the HBM floor and torch SDPA (needs a CUDA GPU, or --allow-cpu)."""
    try:
        from cbbench.perf.bench.kernels import run_kernel_bench  # (brings in torch, pandas)
    except ImportError as e:
        raise CliError(f"the kernel bench is not available ({e})") from None
    try:
        df = run_kernel_bench(str(out), quick=quick, allow_cpu=allow_cpu)
    except RuntimeError as e:
        if "CUDA" in str(e) and not allow_cpu:
            raise CliError("needs a CUDA GPU; --allow-cpu runs a tiny interpreter smoke test instead") from None
        raise CliError(str(e)) from None
    Console().print(df.to_string(index=False), markup=False)
    Console(soft_wrap=True).print(f"wrote {out}", markup=False)
