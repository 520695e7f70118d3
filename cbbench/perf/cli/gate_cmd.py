"""`cbbench gate`: the A/B regression gate's command line (the work is perf/gate/'s).

Its perf options are `cbbench perf`'s own, declared with the same types and help, and passed on as given to every
run of both arms (the defaults differ in two places: one batching mode, `continuous`, and no peers: the gate measures
the tree's engine, not transformers'). Options that name a file are made absolute first, since each arm runs in its
own tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from cbbench.perf.cli import perf_params as options
from cbbench.perf.cli.app import Opt, err, explicit_params, one_line_errors
from cbbench.perf.knobs import NO_GRID, KnobGrid, engine_knob_options, knob_names
from refengine.sim.sim_device import DeviceSpec

# `cbbench perf`'s options a gate passes to every run (the engine knobs too); the rest are the gate's own
FORWARDED = (
    "workload",
    "model",
    "device",
    "dtype",
    "num_prompts",
    "seed",
    "dataset_path",
    "time_scale",
    "hf_split",
    "hf_column",
    "hf_output_column",
    "hf_output_len",
    "max_prompt_len",
    "max_output_len",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "backend",
    "tokenizer",
    "prompt_format",
    "request_timeout",
    "client_workers",
    "ignore_eos",
    "batching",
    "warmup",
    "peers",
    "workload_param",
    "cpu_threads",
    "like",
)
PATH_OPTIONS = ("like", "dataset_path", "model", "tokenizer")  # made absolute when they name something on disk
GATE_BATCHING = "continuous"
GATE_PEERS = "none"
# On a CPU the gate's run keeps 16 ShareGPT prompts, the run its false-alarm rate and power were measured with
# (docs/gate.md), though perf's own CPU default is now 8 (sized for 4 repeats in 3 minutes)
GATE_CPU_NUM_PROMPTS = 16


def _value(v: Any, cwd: Path, name: str) -> str:
    text = str(v)
    if name in PATH_OPTIONS and (cwd / text).exists():
        return str((cwd / text).resolve())
    return text


def forwarded_args(ctx: typer.Context, cwd: Path) -> list[str]:
    """The perf options given on the gate's command line, spelled as perf reads them, plus the gate's own defaults
    for batching and peers (unless --like fixes both)."""
    given = set(explicit_params(ctx))
    names = set(FORWARDED) | set(knob_names(exclude=("batching",)))
    out: list[str] = []
    for p in ctx.command.params:
        if p.name not in names or p.name not in given or not getattr(p, "opts", None):
            continue
        value = ctx.params.get(p.name)
        if getattr(p, "is_flag", False) or isinstance(value, bool):
            out.append(p.opts[0] if value else (p.secondary_opts or [p.opts[0]])[0])
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [p.opts[0], _value(v, cwd, p.name)]
        elif value is not None:
            out += [p.opts[0], _value(value, cwd, p.name)]
    if "like" not in given:
        out += [] if "batching" in given else ["--batching", GATE_BATCHING]
        out += [] if "peers" in given else ["--peers", GATE_PEERS]
        if "num_prompts" not in given and DeviceSpec.parse(str(ctx.params.get("device") or "cpu")).is_cpu:
            out += ["--num-prompts", str(GATE_CPU_NUM_PROMPTS)]
    return out


def _device(device: str, like: Path | None) -> str:
    """The device the runs use: --like's (its rows name it), else --device."""
    if like is None:
        return device
    from cbbench.perf.results.rows import read_rows  # (the command's work: not at --help)

    return str(read_rows(like)[0].get("device") or "cpu")


@one_line_errors("gate")
@engine_knob_options(sweep=True, exclude=("batching",))
def gate(
    ctx: typer.Context,
    base: Annotated[
        Optional[str], Opt(help="the revision to gate against (a branch, tag or sha), checked out as a worktree")
    ] = None,
    head: Annotated[
        Optional[str], Opt(help="the revision to gate (default: the work tree, uncommitted changes included)")
    ] = None,
    base_url: Annotated[
        Optional[str], Opt(help="instead of trees: the base server (OpenAI-compatible), e.g. http://HOST:8000")
    ] = None,
    head_url: Annotated[Optional[str], Opt(help="... and the head server; the two are measured in turn")] = None,
    repeats: Annotated[
        Optional[int],
        Opt(help="runs per arm, each a fresh process, in ABBA order (default 20; 7 on sim:<gpu>, whose runs repeat)"),
    ] = None,
    max_repeats: Annotated[
        Optional[int], Opt(help="while the verdict is inconclusive, add 2 runs per arm (ABBA) up to this many per arm")
    ] = None,
    on_inconclusive: Annotated[
        str, Opt(help="an inconclusive verdict (no regression shown, none ruled out): fail (exit 3) | pass (exit 0)")
    ] = "fail",
    min_effect: Annotated[
        Optional[list[str]],
        Opt(
            help="METRIC=REL (0.02, 2% or off; fnmatch patterns; a bare REL sets every gated metric): the smallest "
            "change that fails; repeat it for several",
            metavar="<metric=rel>",
        ),
    ] = None,
    min_effect_file: Annotated[
        Optional[list[str]], Opt(help="a TOML file whose \\[min-effect] table sets minimum effects", metavar="<path>")
    ] = None,
    confidence: Annotated[
        float, Opt(help="for the whole gate: an unchanged tree fails with probability at most 1 - this")
    ] = 0.95,
    output: Annotated[
        Optional[Path],
        Opt(help="the CSV of every run of both arms (JSON and records beside it; default results/gate-TIME.csv)"),
    ] = None,
    label: options.Label = "",
    format: Annotated[str, Opt("--format", help="the verdict: text | markdown (a CI step summary) | json")] = "text",
    summary: Annotated[
        Optional[Path], Opt(help="also append the verdict as markdown to this file (e.g. $GITHUB_STEP_SUMMARY)")
    ] = None,
    run_timeout: Annotated[
        Optional[float],
        Opt(
            help="seconds one run may take before it is killed and its arm fails (default: 10x the slowest finished "
            "run, at least 300; 3600 before any has finished)",
            metavar="<seconds>",
        ),
    ] = None,
    quiet: Annotated[bool, Opt(help="no line per run on stderr")] = False,
    dry_run: Annotated[bool, Opt("--dry-run", help="print the arms, the order and the commands; run nothing")] = False,
    workload: options.Workload = "sharegpt",
    model: options.Model = None,
    device: options.Device = "cpu",
    dtype: options.Dtype = None,
    num_prompts: Annotated[
        Optional[int],
        Opt(help=f"default: {GATE_CPU_NUM_PROMPTS} on CPU (the gate's measured run), 500 on GPU, 1000 on sim:<gpu>"),
    ] = None,
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
    backend: Annotated[
        str, Opt(help="with --base-url / --head-url: openai | openai-chat | openai-embeddings")
    ] = "openai",
    tokenizer: options.Tokenizer = None,
    prompt_format: options.PromptFormat = "ids",
    request_timeout: options.RequestTimeout = 6 * 3600,
    client_workers: options.ClientWorkers = 1,
    ignore_eos: options.IgnoreEos = True,
    batching: options.Batching = GATE_BATCHING,
    warmup: options.Warmup = 8,
    peers: options.Peers = GATE_PEERS,
    workload_param: options.WorkloadParam = None,
    cpu_threads: options.CpuThreads = None,
    like: options.Like = None,
    knobs: KnobGrid = NO_GRID,
) -> None:
    """Gate a change: base and head measured in one job, interleaved, and a stated test per metric. No baseline file.

    Exit 0: no regression; 1: a regression (significant, in the bad direction, beyond the minimum effect) or a failed head run; 2: bad input or a failed base run; 3: inconclusive, unless --on-inconclusive pass; 128 + N: ended by signal N (docs/gate.md)."""
    from cbbench.perf.gate import signals as sig  # (the command's work: not at --help)
    from cbbench.perf.gate.arms import HEAD, ArmFailed  # (the command's work: not at --help)

    with sig.handled():
        try:
            code = _gate(ctx, locals(), Console(soft_wrap=True, width=max(100, Console().width)))
        except ArmFailed as e:
            err.print(f"cbbench gate: error: {e}", markup=False, soft_wrap=True)
            raise typer.Exit(1 if e.arm == HEAD else 2) from None
        except sig.Interrupted as e:
            why = str(e.args[0]) if e.args else ""
            err.print(f"cbbench gate: interrupted ({why})", markup=False, soft_wrap=True)
            raise typer.Exit(e.exit_code) from None
    raise typer.Exit(code)


def _gate(ctx: typer.Context, a: dict[str, Any], console: Console) -> int:
    from cbbench.perf.gate.run import GateOptions, default_repeats, run_gate  # (the command's work: not at --help)

    cwd = Path.cwd()
    perf_args = forwarded_args(ctx, cwd)
    servers = a["base_url"] is not None or a["head_url"] is not None
    if servers and "backend" not in explicit_params(ctx):
        perf_args = ["--backend", a["backend"], *perf_args]
    elif not servers and "backend" in explicit_params(ctx):
        raise ValueError("--backend is for two servers (--base-url / --head-url); a tree's runs are in-process")
    runs_on = _device(a["device"], a["like"])
    repeats = a["repeats"]
    opts = GateOptions(
        base=a["base"],
        head=a["head"],
        base_url=a["base_url"],
        head_url=a["head_url"],
        perf_args=tuple(perf_args),
        model=a["model"] if servers else None,
        device=runs_on,
        repeats=repeats if repeats is not None else default_repeats(runs_on),
        max_repeats=a["max_repeats"],
        on_inconclusive=a["on_inconclusive"],
        confidence=a["confidence"],
        min_effect=tuple(a["min_effect"] or ()),
        min_effect_files=tuple(a["min_effect_file"] or ()),
        output=a["output"],
        label=a["label"],
        format=a["format"],
        summary=a["summary"],
        run_timeout=a["run_timeout"],
        quiet=a["quiet"],
        dry_run=a["dry_run"],
        cwd=cwd,
    )
    return run_gate(opts, console, err)
