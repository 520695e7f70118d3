"""The `cbbench` command line: perf (the main job), serve, timeline, plot, compare, generate, kernels,
bench-scheduler, bench-step.

Every engine knob of `cbbench perf` maps one to one onto a `SchedulerConfig` / `LLMEngine` keyword, and takes a comma
list to sweep (`--max-num-batched-tokens 512,2048`). Bad input (unknown workload, batching mode, knob value) ends
the command with one line on stderr and exit code 2; a regression found by `compare` exits 1.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from .knobs import engine_knob_options, knob, list_metavar, validate_knobs
from .perf_cmd import CPU_DEFAULTS, PerfOptions, run_perf

# typer >= 0.2x vendors click; its exceptions live beside the public BadParameter either way
_exc = sys.modules[typer.BadParameter.__module__]
_NO_ARGS_IS_HELP = getattr(_exc, "NoArgsIsHelpError", ())


class OneLineErrorsTyper(typer.Typer):
    """Usage errors (unknown option, bad integer) as one line on stderr, exit code 2, instead of a boxed panel."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        command = typer.main.get_command(self)
        try:
            rv = command.main(*args, standalone_mode=False, **kwargs)
        except _NO_ARGS_IS_HELP as e:
            e.show()
            sys.exit(e.exit_code)
        except _exc.ClickException as e:
            err.print(f"cbbench: error: {e.format_message()}", markup=False)
            sys.exit(e.exit_code)
        except (typer.Abort, KeyboardInterrupt):
            err.print("cbbench: interrupted", markup=False)
            sys.exit(130)
        except Exception as e:  # noqa: BLE001 - a failure outside any command (building the app): still one line
            _internal_error("cbbench", e)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _hide_flag_types() -> None:
    """typer 0.2x labels every option with its type in --help, flags too (`--help <bool>`, `--quiet/--no-quiet
    <bool>`), though a flag takes no value: show no type for flags, as click and earlier typer releases do."""
    option_cls = getattr(typer.core, "TyperOption", None)
    shown = getattr(option_cls, "display_type_rich", None)
    if shown is None or getattr(shown, "hides_flags", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)
    display_type_rich.hides_flags = True  # type: ignore[attr-defined]
    option_cls.display_type_rich = display_type_rich


_hide_flag_types()
app = OneLineErrorsTyper(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="cbbench: continuous-batching benchmark and conformance harness.")
err = Console(stderr=True, highlight=False, soft_wrap=True)


class CliError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


DEBUG_ENV = "CBBENCH_DEBUG"  # set to 1 to see the traceback of an internal error


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _internal_error(prog: str, e: BaseException) -> None:
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exception(e)
    err.print(f"{prog}: internal error: {type(e).__name__}: {_first_line(e)} (set {DEBUG_ENV}=1 for the traceback)",
              markup=False)


def one_line_errors(name: str) -> Callable:
    """Every way a command can fail ends with one line on stderr: bad input (CliError, ValueError, a missing or
    unwritable file) exits 2, an interrupt 130, anything else is an internal error and exits 1."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (typer.Exit, _exc.ClickException):
                raise
            except (CliError, ValueError, FileNotFoundError, PermissionError, IsADirectoryError,
                    NotADirectoryError) as e:
                err.print(f"cbbench {name}: error: {_first_line(e)}", markup=False)
                raise typer.Exit(2) from None
            except (typer.Abort, KeyboardInterrupt) as e:
                why = str(e).strip()  # perf says where the finished runs are
                err.print(f"cbbench {name}: interrupted" + (f": {why}" if why else ""), markup=False)
                raise typer.Exit(130) from None
            except Exception as e:  # noqa: BLE001 - a bug: one line, not a double traceback
                _internal_error(f"cbbench {name}", e)
                raise typer.Exit(1) from None
        return inner
    return wrap


Opt = typer.Option
# what `perf --like` lets the command line set: how to run, where to write, not what to run
LIKE_MAY_SET = {"like", "repeats", "warmup", "cpu_threads", "quiet", "output", "label", "resume", "result_dir",
                "metric_percentiles", "goodput"}


def explicit_params(ctx: typer.Context) -> list[str]:
    """The parameters given on the command line (or by environment), not left at their defaults."""
    def given(name: str) -> bool:
        src = ctx.get_parameter_source(name)
        return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")
    return [p.name for p in ctx.command.params if p.name and given(p.name)] + (["goodput"] if ctx.args else [])


def command_line(ctx: typer.Context) -> str:
    """`cbbench perf` with every option that was given, canonically spelled: what a result records so that a
    reader (or `compare`'s message) can see how it was made."""
    import shlex

    parts = ["cbbench", ctx.info_name or "perf"]
    given = set(explicit_params(ctx))
    for p in ctx.command.params:
        if p.name not in given or not getattr(p, "opts", None):
            continue
        value = ctx.params.get(p.name)
        if getattr(p, "is_flag", False) or isinstance(value, bool):
            parts.append(p.opts[0] if value else (p.secondary_opts or [p.opts[0]])[0])
        elif isinstance(value, (list, tuple)):
            for v in value:
                parts += [p.opts[0], str(v)]
        elif value is not None:
            parts += [p.opts[0], str(value)]
    parts += list(ctx.args)
    return shlex.join(parts)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
@one_line_errors("perf")
@engine_knob_options(sweep=True, exclude=("batching",), help={
    "max_num_seqs": f"most requests in a batch; also the HF static batch size and hf-cb's in-flight cap "
                    f"(CPU default {CPU_DEFAULTS['max_num_seqs']})"})
def perf(
    ctx: typer.Context,
    workload: Annotated[str, Opt(help="sharegpt | fixed | random | lognormal | prefix")] = "sharegpt",
    model: Annotated[str, Opt(help="a preset name or a local Hugging Face folder")] = "tiny-qwen2",
    device: Annotated[str, Opt(help="in-process device; for --backend openai* it only picks the CPU or GPU "
                                    "workload defaults")] = "cpu",
    dtype: Annotated[Optional[str], Opt(help="default: float32 on CPU, bfloat16 on CUDA")] = None,
    num_prompts: Annotated[Optional[int], Opt(help=f"default: {CPU_DEFAULTS['num_prompts']} on CPU, 500 on GPU")] = None,
    seed: Annotated[int, Opt()] = 0,
    dataset_path: Annotated[Optional[str], Opt(help="a full ShareGPT_V3 JSON (default: the bundled file)")] = None,
    max_prompt_len: Annotated[Optional[int], Opt(help=f"sharegpt prompt cap (CPU default "
                                                      f"{CPU_DEFAULTS['max_prompt_len']}, GPU none)")] = None,
    max_output_len: Annotated[Optional[int], Opt(help=f"sharegpt output cap (CPU default "
                                                      f"{CPU_DEFAULTS['max_output_len']}, GPU none)")] = None,
    request_rate: Annotated[str, Opt(help="requests/s; inf = all at t0 (offline); comma list: one run each",
                                     metavar=list_metavar("float"))] = "inf",
    burstiness: Annotated[str, Opt(help="gamma shape of inter-arrival times; 1 = Poisson; comma list",
                                   metavar=list_metavar("float"))] = "1",
    max_concurrency: Annotated[Optional[str], Opt(help="requests in flight at most, as vllm bench serve's "
                                                       "(comma list; default no cap)", metavar=list_metavar("int"))] = None,
    backend: Annotated[str, Opt(help="refengine (in-process) | openai (/v1/completions) | openai-chat")] = "refengine",
    base_url: Annotated[Optional[str], Opt(help="the server for --backend openai*, e.g. http://127.0.0.1:8000")] = None,
    tokenizer: Annotated[Optional[str], Opt(help="for the workloads: a preset, a folder or qwen (default: the "
                                                 "model's own if a preset/folder, else the Qwen BPE)")] = None,
    prompt_format: Annotated[str, Opt(help="--backend openai: send prompts as token ids or text")] = "ids",
    request_timeout: Annotated[float, Opt(help="--backend openai*: seconds a request may take (vLLM's 6 h)")] = 6 * 3600,
    ignore_eos: Annotated[bool, Opt("--ignore-eos/--no-ignore-eos", help="--backend openai*: send vLLM's ignore_eos "
                                    "(off for servers that refuse unknown fields)")] = True,
    batching: Annotated[str, Opt(help="comma list of continuous,sequence,static,none",
                                 metavar=list_metavar("str"))] = "continuous,sequence,static,none",
    repeats: Annotated[int, Opt(help="runs per configuration; the table shows the median")] = 1,
    warmup: Annotated[int, Opt(help="short synthetic requests of staggered lengths run first, not measured")] = 8,
    peers: Annotated[str, Opt(help="comma list of hf-static,hf-cb, or none", metavar=list_metavar("str"))] = "hf-static,hf-cb",
    metric_percentiles: Annotated[str, Opt(help="latency percentiles to compute; p50, p75, p90, p95, p99 and "
                                               "p99.9 always are, others go to the CSV's extra column",
                                          metavar=list_metavar("float"))] = "50,90,99",
    goodput: Annotated[Optional[list[str]], Opt(help="SLOs NAME:MS, e.g. --goodput ttft:500 tpot:50",
                                                   metavar="<name:ms>")] = None,
    result_dir: Annotated[Path, Opt()] = Path("results"),
    workload_param: Annotated[Optional[list[str]], Opt(help="KEY=VALUE for the workload, e.g. input_len=1024",
                                                          metavar="<key=value>")] = None,
    cpu_threads: Annotated[Optional[int], Opt(help="torch threads on CPU (default 1: stable on shared CPUs; "
                                                   "0 = torch's default)")] = None,
    quiet: Annotated[bool, Opt(help="no progress bar")] = False,
    output: Annotated[Optional[Path], Opt(help="the CSV to write, the JSON beside it (default: RESULT_DIR/"
                                               "WORKLOAD-TIME.csv); each run is written as it finishes")] = None,
    label: Annotated[str, Opt(help="a name for these runs (the CSV's label column; compare and plot show it)")] = "",
    resume: Annotated[bool, Opt(help="complete --output: skip the runs it already holds")] = False,
    like: Annotated[Optional[Path], Opt(help="rerun exactly the configurations of this results CSV (a "
                                             "baseline): its workload, engines, modes, knobs and repeats")] = None,
    knobs: Optional[dict] = None,
) -> None:
    """Replay a workload through every batching mode (and the peers); print the table, write CSV + JSON."""
    goodput, workload_param = list(goodput or []), list(workload_param or [])
    for extra in ctx.args:  # `--goodput ttft:500 tpot:50` / `--workload-param a=1 b=2`, as vLLM's nargs options
        if "=" in extra:
            workload_param.append(extra)
        elif ":" in extra:
            goodput.append(extra)
        else:
            raise CliError(f"unexpected argument {extra!r}")
    opts = PerfOptions(
        workload=workload, model=model, device=device, dtype=dtype, num_prompts=num_prompts, seed=seed,
        dataset_path=dataset_path, max_prompt_len=max_prompt_len, max_output_len=max_output_len,
        request_rate=request_rate, burstiness=burstiness, batching=batching, repeats=repeats, warmup=warmup,
        max_concurrency=max_concurrency, backend=backend, base_url=base_url, tokenizer=tokenizer,
        prompt_format=prompt_format, ignore_eos=ignore_eos, request_timeout=request_timeout, peers=peers, metric_percentiles=metric_percentiles, goodput=goodput,
        result_dir=result_dir,
        workload_params=workload_param, cpu_threads=cpu_threads, quiet=quiet,
        knobs=dict(knobs or {}), output=output, label=label, resume=resume, like=like, command=command_line(ctx),
    )
    if like is not None:  # the configurations are the baseline's; only how to run them may be given
        given = [p for p in explicit_params(ctx) if p not in LIKE_MAY_SET]
        if given:
            raise CliError(f"--like takes the configurations from {like}; leave out --{given[0].replace('_', '-')}")
        explicit = explicit_params(ctx)
        opts.repeats = repeats if "repeats" in explicit else None
        opts.warmup = warmup if "warmup" in explicit else None
        opts.cpu_threads = cpu_threads if "cpu_threads" in explicit else None
    run_perf(opts, Console())  # the table fits the terminal (perf/report.py)


@app.command()
@one_line_errors("serve")
@engine_knob_options(sweep=False)
def serve(
    model: Annotated[str, Opt(help="a preset name or a local Hugging Face folder")] = "tiny-qwen2",
    host: Annotated[str, Opt()] = "127.0.0.1",
    port: Annotated[int, Opt()] = 8000,
    served_model_name: Annotated[Optional[str], Opt(help="the name clients send as \"model\" (default: --model)")] = None,
    device: Annotated[str, Opt()] = "cpu",
    dtype: Annotated[Optional[str], Opt(help="default: float32 on CPU, bfloat16 on CUDA")] = None,
    seed: Annotated[int, Opt()] = 0,
    cpu_threads: Annotated[Optional[int], Opt(help="torch threads on CPU (default: torch's)")] = None,
    log_level: Annotated[str, Opt(help="uvicorn's: critical | error | warning | info | debug")] = "info",
    knobs: Optional[dict] = None,
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /metrics)."""
    from refengine.entrypoints.api_server import run_server

    given = {k: v for k, v in (knobs or {}).items() if v is not None}
    validate_knobs(given)  # a bad knob fails before the model loads
    engine_kwargs = {"model": model, "device": device, "dtype": dtype, "seed": seed, **given}
    if cpu_threads:
        import torch

        torch.set_num_threads(cpu_threads)
    run_server(engine_kwargs, host=host, port=port, served_model_name=served_model_name, log_level=log_level)


@app.command()
@one_line_errors("timeline")
def timeline(
    out: Annotated[Path, Opt(help="PNG to write")] = Path("results/timeline.png"),
    model: Annotated[str, Opt()] = "tiny-qwen2",
    device: Annotated[str, Opt()] = "cpu",
    num_requests: Annotated[int, Opt(help="requests of varied lengths")] = 12,
    max_num_seqs: Annotated[int, Opt(help="slots")] = 4,
    seed: Annotated[int, Opt()] = 0,
    batching: Annotated[str, Opt(help="comma list of modes, one panel each",
                                 metavar=list_metavar("str"))] = "continuous,sequence,static,none",
) -> None:
    """The seed's picture from a real run: which request holds which slot at each step, per batching mode."""
    from .timeline import run_timeline

    modes = knob("batching").parse_list(batching)
    path, util = run_timeline(out, model=model, device=device, num_requests=num_requests,
                              max_num_seqs=max_num_seqs, seed=seed, modes=modes)
    Console().print(f"wrote {path}  (slot utilisation: " + ", ".join(f"{m} {u:.0%}" for m, u in util.items()) + ")",
                    markup=False)


@app.command()
@one_line_errors("plot")
def plot(
    result_csvs: Annotated[list[Path], typer.Argument(help="one or more cbbench perf CSVs", metavar="CSV")],
    label: Annotated[Optional[list[str]], Opt(help="one per CSV, in order (default: the CSV's label column, "
                                                   "else its file name)", metavar="<str>")] = None,
    kind: Annotated[str, Opt(help="auto | latency (against throughput, across request rates) | sweep (against "
                                  "--knob); auto picks latency when the CSVs hold several request rates")] = "auto",
    knob: Annotated[str, Opt(help="the swept column on the x axis (sweep)")] = "max_num_batched_tokens",
    out: Annotated[Optional[Path], Opt(help="PNG, or a folder (default: next to the first CSV)")] = None,
) -> None:
    """Result CSVs as curves with error bars from repeats: latency against throughput, or against a swept knob."""
    from .plot import plot_results

    Console().print(f"wrote {plot_results(result_csvs, labels=label, kind=kind, knob=knob, out=out)}", markup=False)


@app.command()
@one_line_errors("report")
def report(
    run_json: Annotated[Path, typer.Argument(help="the JSON a cbbench perf run wrote", metavar="RUN_JSON")],
    out: Annotated[Optional[Path], Opt("--out", "-o", help="HTML file or folder (default: beside the JSON)")] = None,
) -> None:
    """One self-contained HTML page: results table, TTFT / ITL CDFs, slot timelines, environment."""
    from .html_report import write_report

    Console().print(f"wrote {write_report(run_json, out)}", markup=False)


@app.command()
@one_line_errors("compare")
def compare(
    baseline: Annotated[Path, typer.Argument(help="baseline results CSV", metavar="BASELINE")],
    new: Annotated[Path, typer.Argument(help="new results CSV", metavar="NEW")],
    tolerance: Annotated[Optional[list[str]], Opt(help="METRIC=REL (0.2, 20% or off; fnmatch patterns allowed); "
                                                                "repeat it for several", metavar="<metric=rel>")] = None,
    allow_missing: Annotated[bool, Opt(help="a baseline config missing from NEW is not a failure")] = False,
    only_changes: Annotated[bool, Opt(help="hide rows within tolerance")] = False,
    ignore_key: Annotated[Optional[list[str]], Opt(help="key columns not matched on; `server` = all but the model "
                                                        "and the load (in-process vs HTTP runs)", metavar="<column>")] = None,
    format: Annotated[str, Opt("--format", help="text | markdown (a CI step summary) | json")] = "text",
    tolerance_files: Annotated[bool, Opt(help="read BASELINE's sidecar NAME.tolerances.toml and the "
                                              "tool.cbbench.tolerances table of pyproject.toml")] = True,
) -> None:
    """Per configuration and metric: change, direction, tolerance. Exit 1 on a regression, 2 on bad input.

    A regression is a median worse than the baseline's by more than the tolerance AND every new repeat worse
    than every baseline repeat (see perf/compare.py)."""
    from .compare import main_compare, parse_tolerances

    tol = parse_tolerances(tolerance or [])
    code = main_compare(baseline, new, tol, fail_on_missing=not allow_missing, only_changes=only_changes,
                        ignore_key=ignore_key or [], console=Console(width=max(100, Console().width)), err=err,
                        fmt=format, use_tolerance_files=tolerance_files)
    raise typer.Exit(code)


@app.command()
@one_line_errors("generate")
def generate(
    prompts: Annotated[list[str], typer.Argument(help="one or more prompts", metavar="PROMPT")],
    model: Annotated[str, Opt()] = "tiny-qwen2",
    device: Annotated[str, Opt()] = "cpu",
    max_tokens: Annotated[int, Opt()] = 16,
    temperature: Annotated[float, Opt()] = 0.0,
) -> None:
    """Generate for a few prompts and print them (random-weight presets print gibberish, by design)."""
    from refengine import LLM, SamplingParams

    llm = LLM(model=model, device=device)
    for p, o in zip(prompts, llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=temperature))):
        c = o.outputs[0]
        Console().print(f"[bold]{p!r}[/] -> {c.text!r}  ({len(c.token_ids)} tokens, {c.finish_reason})")


@app.command()
@one_line_errors("kernels")
def kernels(
    out: Annotated[Path, Opt()] = Path("results/kernels.csv"),
    quick: Annotated[bool, Opt(help="a few shapes only")] = False,
    allow_cpu: Annotated[bool, Opt(help="without CUDA: a tiny smoke run under TRITON_INTERPRET "
                                        "(checks the bookkeeping; its timings mean nothing)")] = False,
) -> None:
    """Attention kernels against the HBM floor and torch SDPA (needs a CUDA GPU, or --allow-cpu)."""
    try:
        from .kernel_bench import run_kernel_bench
    except ImportError as e:
        raise CliError(f"the kernel bench is not available ({e})") from None
    try:
        df = run_kernel_bench(str(out), quick=quick, allow_cpu=allow_cpu)
    except RuntimeError as e:
        if "CUDA" in str(e) and not allow_cpu:
            raise CliError("needs a CUDA GPU; --allow-cpu runs a tiny interpreter smoke test instead") from None
        raise CliError(str(e)) from None
    Console().print(df.to_string(index=False), markup=False)
    Console().print(f"wrote {out}", markup=False)


@app.command("bench-scheduler")
@one_line_errors("bench-scheduler")
def bench_scheduler(
    running: Annotated[str, Opt(help="comma list of running decode counts", metavar=list_metavar("int"))] = "32,256,1024",
    iters: Annotated[int, Opt(help="timed steps per size")] = 200,
) -> None:
    """Microseconds per schedule() + update_from_output() step with N running decodes (model-free)."""
    from .bench_scheduler import bench_step_us

    sizes = _ints("running", running)
    if not sizes or min(sizes) < 1:
        raise CliError(f"running: expected a comma list of integers >= 1, got {running!r}")
    if iters < 1:
        raise CliError(f"iters must be >= 1, got {iters}")
    console = Console()
    for n in sizes:
        s = bench_step_us(n, iters=iters)
        console.print(f"{n:>5} running decodes: median {s['median_us']:8.1f} us/step  "
                      f"(p90 {s['p90_us']:.1f}, min {s['min_us']:.1f})")


@app.command("bench-step")
@one_line_errors("bench-step")
def bench_step(
    stub_model: Annotated[bool, Opt("--stub-model/--real-model", help="replace the forward by a stub that returns "
                                    "at once (host time only), or run the real model")] = False,
    running: Annotated[str, Opt(help="comma list of running decode counts", metavar=list_metavar("int"))] = "64,256",
    iters: Annotated[int, Opt(help="timed steps per size")] = 100,
    warmup: Annotated[int, Opt(help="untimed steps first")] = 5,
    model: Annotated[str, Opt()] = "tiny-qwen2",
    device: Annotated[str, Opt()] = "cpu",
    stop: Annotated[Optional[list[str]], Opt(help="stop strings every request carries (never met)",
                                                     metavar="<str>")] = None,
    cpu_threads: Annotated[int, Opt(help="torch threads (default 1: the host work is one Python thread, and one "
                                         "torch thread keeps a shared CPU's timings stable; 0 = torch's default)")] = 1,
    breakdown: Annotated[bool, Opt(help="also the CPU time of schedule / execute_model / update_from_output / "
                                        "the rest (outputs)")] = False,
    detokenizer: Annotated[str, Opt(help="incremental (the engine's), or full-redecode (the whole output decoded "
                                          "every step, as before issue 11: the before/after comparison)")] = "incremental",
) -> None:
    """Microseconds per whole engine step (schedule, forward, sampling, update, outputs) at N running decodes.

    It times schedule, input preparation, forward, sampling, update_from_output, detokenisation and outputs; with
    --stub-model the forward costs nothing, so this is the engine's host time."""
    import torch

    from .bench_step import bench_engine_step_us, format_breakdown, format_table

    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    sizes = _ints("running", running)
    if not sizes or min(sizes) < 1 or iters < 1 or warmup < 0:
        raise CliError("running must list positive counts, iters must be >= 1 and warmup >= 0")
    rows = [bench_engine_step_us(n, iters=iters, warmup=warmup, model=model, device=device, stub=stub_model,
                                 stop=stop, breakdown=breakdown, detokenizer=detokenizer) for n in sizes]
    typer.echo(f"engine step, {'stub' if stub_model else 'real'} model {model} on {device}, {detokenizer} "
               f"detokenizer, {iters} timed steps each")
    typer.echo(format_table(rows))  # plain text: a table must not wrap at a narrow terminal's width
    if breakdown:
        typer.echo("median CPU us per step, by phase (outputs: stop strings, detokenisation, RequestOutputs, stats):")
        typer.echo(format_breakdown(rows))


@app.command("bench-async")
@one_line_errors("bench-async")
def bench_async(
    num_requests: Annotated[int, Opt(help="requests, all added at once")] = 32,
    prompt_len: Annotated[int, Opt(help="prompt tokens per request")] = 64,
    max_tokens: Annotated[int, Opt(help="output tokens per request (ignore_eos)")] = 64,
    repeats: Annotated[int, Opt(help="timed runs per mode, alternating")] = 3,
    max_num_seqs: Annotated[int, Opt(help="most requests in a batch")] = 256,
    device_ms: Annotated[Optional[float], Opt(help="replace the forward by a stub that sleeps this long (device time "
                                              "that needs no host CPU, as a GPU's); default: the real model")] = None,
    model: Annotated[str, Opt()] = "tiny-qwen2",
    device: Annotated[str, Opt()] = "cpu",
    cpu_threads: Annotated[int, Opt(help="torch threads (default 1: the forward on one core, the host work of the "
                                         "other step beside it; 0 = torch's default)")] = 1,
) -> None:
    """Throughput of one workload with async scheduling off and on, same process, and the ratio on / off."""
    import torch

    from .bench_async import bench_async as run, format_table

    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    if min(num_requests, prompt_len, max_tokens, repeats, max_num_seqs) < 1 or (device_ms or 0) < 0:
        raise CliError("num-requests, prompt-len, max-tokens, repeats and max-num-seqs must be >= 1, device-ms >= 0")
    rows = run(num_requests, prompt_len, max_tokens, repeats, model=model, device=device, max_num_seqs=max_num_seqs,
               device_ms=device_ms)
    forward = "real forward" if device_ms is None else f"stub forward sleeping {device_ms:g} ms"
    typer.echo(f"async scheduling, {model} on {device} ({forward}), {num_requests} x ({prompt_len} in, {max_tokens} "
               f"out), {repeats} runs per mode, torch threads {torch.get_num_threads()}")
    typer.echo(format_table(rows))


def _ints(name: str, text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{name}: expected a comma list of integers, got {text!r}") from None


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
