"""The `cbbench` command line: perf (the main job), serve, timeline, plot, report, compare, generate, kernels,
bench-scheduler, bench-step, bench-async.

Every engine knob of `cbbench perf` maps one to one onto a `SchedulerConfig` / `LLMEngine` keyword, and takes a comma
list to sweep (`--max-num-batched-tokens 512,2048`). Bad input (unknown workload, batching mode, knob value) ends
the command with one line on stderr and exit code 2; a regression found by `compare` exits 1.

This file holds `perf` and the command table; the app and its error handling are in app.py, the other commands
in commands.py and bench.py. `perf` only turns its options into `PerfOptions`: sweep.py does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from cbbench.perf.cli.app import (
    DEBUG_ENV,
    LIKE_MAY_SET,
    CliError,
    Opt,
    app,
    command_line,
    err,
    explicit_params,
    one_line_errors,
)
from cbbench.perf.cli.bench import bench_async, bench_scheduler, bench_step
from cbbench.perf.cli.commands import compare, generate, kernels, plot, report, serve, show, timeline
from cbbench.perf.cli.profile import bench_profile
from cbbench.perf.errors import NoResultError
from cbbench.perf.knobs import engine_knob_options, list_metavar
from cbbench.perf.plan.options import CPU_DEFAULTS, PerfOptions

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
    workload: Annotated[
        str,
        Opt(
            help="sharegpt | fixed | random | lognormal | prefix | custom | hf | trace | "
            "multiturn | sharegpt-multiturn (docs/workloads.md)"
        ),
    ] = "sharegpt",
    model: Annotated[
        Optional[str],
        Opt(help="a preset name or a local Hugging Face folder (default: tiny-qwen2; llama-3.1-8b on sim:<gpu>)"),
    ] = None,
    device: Annotated[
        str,
        Opt(
            help="in-process device (cpu, cuda[:N], or a simulated GPU sim:h100 / sim:h200 / "
            "sim:a100); for --backend openai* it only picks the workload defaults"
        ),
    ] = "cpu",
    dtype: Annotated[Optional[str], Opt(help="default: float32 on CPU, bfloat16 on CUDA and sim:<gpu>")] = None,
    num_prompts: Annotated[
        Optional[int], Opt(help=f"default: {CPU_DEFAULTS['num_prompts']} on CPU, 500 on GPU, 1000 on sim:<gpu>")
    ] = None,
    seed: Annotated[int, Opt()] = 0,
    dataset_path: Annotated[
        Optional[str],
        Opt(
            help="the workload's file, never fetched: sharegpt / "
            "sharegpt-multiturn a ShareGPT_V3 JSON (default: the bundled "
            "file), custom a JSONL of prompts, hf a local datasets folder "
            "or parquet / arrow / jsonl / csv file, trace an Azure, "
            "Mooncake or plain trace"
        ),
    ] = None,
    time_scale: Annotated[
        Optional[float], Opt(help="--workload trace: arrival-time factor (2 = half speed, 0.5 = double)")
    ] = None,
    hf_split: Annotated[Optional[str], Opt(help="--workload hf: the split of a datasets folder")] = None,
    hf_column: Annotated[
        Optional[str],
        Opt(help="--workload hf: the prompt column (default: the first of prompt, text, question, instruction, input)"),
    ] = None,
    hf_output_column: Annotated[
        Optional[str], Opt(help="--workload hf: a column holding each request's output length")
    ] = None,
    hf_output_len: Annotated[
        Optional[int], Opt(help="--workload hf: the output length of every request (default 256)")
    ] = None,
    max_prompt_len: Annotated[
        Optional[int], Opt(help=f"sharegpt prompt cap (CPU default {CPU_DEFAULTS['max_prompt_len']}, GPU none)")
    ] = None,
    max_output_len: Annotated[
        Optional[int], Opt(help=f"sharegpt output cap (CPU default {CPU_DEFAULTS['max_output_len']}, GPU none)")
    ] = None,
    request_rate: Annotated[
        str, Opt(help="requests/s; inf = all at t0 (offline); comma list: one run each", metavar=list_metavar("float"))
    ] = "inf",
    burstiness: Annotated[
        str, Opt(help="gamma shape of inter-arrival times; 1 = Poisson; comma list", metavar=list_metavar("float"))
    ] = "1",
    max_concurrency: Annotated[
        Optional[str],
        Opt(
            help="requests in flight at most, as vllm bench serve's (comma list; default no cap)",
            metavar=list_metavar("int"),
        ),
    ] = None,
    backend: Annotated[
        str,
        Opt(
            help="refengine (in-process) | openai (/v1/completions) | openai-chat | openai-embeddings (/v1/embeddings)"
        ),
    ] = "refengine",
    base_url: Annotated[Optional[str], Opt(help="the server for --backend openai*, e.g. http://127.0.0.1:8000")] = None,
    tokenizer: Annotated[
        Optional[str],
        Opt(
            help="for the workloads: a preset, a local folder or tokenizer.json, "
            "or qwen (default: the model's own if a preset/folder, else the "
            "Qwen BPE); a hub id needs its files in a local folder"
        ),
    ] = None,
    prompt_format: Annotated[str, Opt(help="--backend openai: send prompts as token ids or text")] = "ids",
    request_timeout: Annotated[float, Opt(help="--backend openai*: seconds a request may take (vLLM's 6 h)")] = 6
    * 3600,
    client_workers: Annotated[
        int, Opt(help="--backend openai*: client processes the requests are sharded over (one clock; records merged)")
    ] = 1,
    ignore_eos: Annotated[
        bool,
        Opt(
            "--ignore-eos/--no-ignore-eos",
            help="--backend openai*: send vLLM's ignore_eos (off for servers that refuse unknown fields)",
        ),
    ] = True,
    batching: Annotated[
        str, Opt(help="comma list of continuous,sequence,static,none", metavar=list_metavar("str"))
    ] = "continuous,sequence,static,none",
    repeats: Annotated[int, Opt(help="runs per configuration; the table shows the median")] = 1,
    warmup: Annotated[int, Opt(help="short synthetic requests of staggered lengths run first, not measured")] = 8,
    peers: Annotated[
        str, Opt(help="comma list of hf-static,hf-cb, or none", metavar=list_metavar("str"))
    ] = "hf-static,hf-cb",
    metric_percentiles: Annotated[
        str,
        Opt(
            help="latency percentiles to compute; p50, p75, p90, p95, p99 and "
            "p99.9 always are, others go to the CSV's extra column",
            metavar=list_metavar("float"),
        ),
    ] = "50,90,99",
    goodput: Annotated[
        Optional[list[str]], Opt(help="SLOs NAME:MS, e.g. --goodput ttft:500 tpot:50", metavar="<name:ms>")
    ] = None,
    result_dir: Annotated[Path, Opt()] = Path("results"),
    workload_param: Annotated[
        Optional[list[str]], Opt(help="KEY=VALUE for the workload, e.g. input_len=1024", metavar="<key=value>")
    ] = None,
    cpu_threads: Annotated[
        Optional[int], Opt(help="torch threads on CPU (default 1: stable on shared CPUs; 0 = torch's default)")
    ] = None,
    quiet: Annotated[bool, Opt(help="no progress bar")] = False,
    format: Annotated[str, Opt("--format", help="the table: text | markdown | json (the files are the same)")] = "text",
    output: Annotated[
        Optional[Path],
        Opt(
            help="the CSV to write, the JSON beside it (default: RESULT_DIR/"
            "WORKLOAD-TIME.csv); each run is written as it finishes"
        ),
    ] = None,
    label: Annotated[str, Opt(help="a name for these runs (the CSV's label column; compare and plot show it)")] = "",
    resume: Annotated[bool, Opt(help="complete --output: skip the runs it already holds")] = False,
    like: Annotated[
        Optional[Path],
        Opt(
            help="rerun exactly the configurations of this results CSV (a "
            "baseline): its workload, engines, modes, knobs and repeats"
        ),
    ] = None,
    dry_run: Annotated[bool, Opt("--dry-run", help="print the plan, one line per run, and stop: nothing runs")] = False,
    knobs: Optional[dict] = None,
) -> None:
    """Replay a workload through every batching mode (and the peers); print the table, write CSV + JSON."""
    opts = _perf_options(ctx, dict(locals()))  # every option by its name
    if dry_run:
        from cbbench.perf.sweep import show_plan

        show_plan(opts, Console())
    else:
        try:
            run_perf(opts, Console())  # the table fits the terminal (report/table.py)
        except NoResultError as e:  # a benchmark that measured nothing never passes; the files are written
            err.print(f"cbbench perf: error: {e}", markup=False)
            raise typer.Exit(1) from None


def run_perf(opts: PerfOptions, console: Console) -> None:
    """sweep.run_perf, imported on first use: the sweep pulls in pandas and the backends, which --help never needs."""
    from cbbench.perf.sweep import run_perf as run

    run(opts, console)


_NOT_FIELDS = ("ctx", "dry_run", "goodput", "workload_param", "knobs")  # options that PerfOptions takes otherwise


def _perf_options(ctx: typer.Context, p: dict[str, Any]) -> PerfOptions:
    """The `PerfOptions` of a `cbbench perf` command line (`p`: its parameters by name)."""
    goodput, workload_param = list(p["goodput"] or []), list(p["workload_param"] or [])
    for extra in ctx.args:  # `--goodput ttft:500 tpot:50` / `--workload-param a=1 b=2`, as vLLM's nargs options
        if "=" in extra:
            workload_param.append(extra)
        elif ":" in extra:
            goodput.append(extra)
        else:
            raise CliError(f"unexpected argument {extra!r}")
    opts = PerfOptions(
        **{k: v for k, v in p.items() if k not in _NOT_FIELDS},
        goodput=goodput,
        workload_params=workload_param,
        knobs=dict(p["knobs"] or {}),
        command=command_line(ctx),
    )
    if p["like"] is not None:  # the configurations are the baseline's; only how to run them may be given
        explicit = explicit_params(ctx)
        given = [name for name in explicit if name not in LIKE_MAY_SET]
        if given:
            raise CliError(
                f"--like takes the configurations from {p['like']}; leave out --{given[0].replace('_', '-')}"
            )
        opts.repeats = p["repeats"] if "repeats" in explicit else None
        opts.warmup = p["warmup"] if "warmup" in explicit else None
        opts.cpu_threads = p["cpu_threads"] if "cpu_threads" in explicit else None
    return opts


# The command table, in --help order. perf stays here, where it finds `run_perf` (tests replace it on this module).
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})(perf)
app.command()(serve)
app.command()(timeline)
app.command()(plot)
app.command()(report)
app.command()(show)
app.command()(compare)
app.command()(generate)
app.command()(kernels)
app.command("bench-scheduler")(bench_scheduler)
app.command("bench-profile")(bench_profile)
app.command("bench-step")(bench_step)
app.command("bench-async")(bench_async)


def main() -> None:  # pragma: no cover
    app()
