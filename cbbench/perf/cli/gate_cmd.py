"""`cbbench gate`: the A/B regression gate's command line (the work is perf/gate/'s).

Its perf options are `cbbench perf`'s own declarations (plan/declared.py), passed on as given to every run of both
arms (`FORWARDED`; the gate's own defaults differ in two places: one batching mode, `continuous`, and no peers: the
gate measures the tree's engine, not transformers'). Its own options are declared here (`GATE`), as perf's are, and
the command takes both from the declarations (cli/params.py). Options that name a file are made absolute first, since
each arm runs in its own tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from cbbench.perf.cli.app import err, explicit_params, one_line_errors
from cbbench.perf.cli.params import takes
from cbbench.perf.knobs import NO_GRID, KnobGrid, engine_knob_options, knob_names
from cbbench.perf.plan.declared import (
    BACKEND,
    DEVICE,
    ENGINE,
    GPU_NUM_PROMPTS,
    OUTPUT,
    RUN,
    SEED_DATASET_AND_LOAD,
    SIM_NUM_PROMPTS,
    WORKLOAD,
    Group,
    Values,
    option,
    optional,
    repeated,
)
from refengine.sim.sim_device import DeviceSpec

GATE_BATCHING = "continuous"
GATE_PEERS = "none"
# On a CPU the gate's run keeps 16 ShareGPT prompts, the run its false-alarm rate and power were measured with
# (docs/gate.md), though perf's own CPU default is now 8 (sized for 4 repeats in 3 minutes)
GATE_CPU_NUM_PROMPTS = 16


class _Gate(Group):
    """The gate's own options: what to gate, how the verdict is reached, where it goes (perf/gate/run.py's
    `GateOptions`)."""

    title = "gate"
    base = optional(str, "the revision to gate against (a branch, tag or sha), checked out as a worktree")
    head = optional(str, "the revision to gate (default: the work tree, uncommitted changes included)")
    base_url = optional(str, "instead of trees: the base server (OpenAI-compatible), e.g. http://HOST:8000")
    head_url = optional(str, "... and the head server; the two are measured in turn")
    repeats = optional(
        int, "runs per arm, each a fresh process, in ABBA order (default 20; 7 on sim:<gpu>, whose runs repeat)"
    )
    max_repeats = optional(int, "while the verdict is inconclusive, add 2 runs per arm (ABBA) up to this many per arm")
    on_inconclusive = option(
        str, "fail", "an inconclusive verdict (no regression shown, none ruled out): fail (exit 3) | pass (exit 0)"
    )
    min_effect = repeated(
        "METRIC=REL (0.02, 2% or off; fnmatch patterns; a bare REL sets every gated metric): the smallest change that "
        "fails; repeat it for several",
        "<metric=rel>",
    )
    min_effect_file = repeated("a TOML file whose \\[min-effect] table sets minimum effects", "<path>")
    confidence = option(float, 0.95, "for the whole gate: an unchanged tree fails with probability at most 1 - this")
    output = optional(
        Path, "the CSV of every run of both arms (JSON and records beside it; default results/gate-TIME.csv)"
    )
    format = option(str, "text", "the verdict: text | markdown (a CI step summary) | json", flags=("--format",))
    summary = optional(Path, "also append the verdict as markdown to this file (e.g. $GITHUB_STEP_SUMMARY)")
    run_timeout = optional(
        float,
        "seconds one run may take before it is killed and its arm fails (default: 10x the slowest finished run, at "
        "least 300; 3600 before any has finished)",
        metavar="<seconds>",
    )
    quiet = option(bool, False, "no line per run on stderr")
    dry_run = option(bool, False, "print the arms, the order and the commands; run nothing", flags=("--dry-run",))


GATE = _Gate()
# `cbbench perf`'s options a gate passes to every run (the engine knobs too), with the gate's own defaults for the
# prompts on a CPU, the backend of two servers, the batching modes and the peers
FORWARDED = (
    WORKLOAD.workload,
    ENGINE.model,
    DEVICE.device,
    ENGINE.dtype,
    WORKLOAD.num_prompts.but(
        help=f"default: {GATE_CPU_NUM_PROMPTS} on CPU (the gate's measured run), {GPU_NUM_PROMPTS} on GPU, "
        f"{SIM_NUM_PROMPTS} on sim:<gpu>"
    ),
    *SEED_DATASET_AND_LOAD,
    BACKEND.backend.but(
        default="openai", help="with --base-url / --head-url: openai | openai-chat | openai-embeddings"
    ),
    WORKLOAD.tokenizer,
    BACKEND.prompt_format,
    BACKEND.request_timeout,
    BACKEND.client_workers,
    BACKEND.ignore_eos,
    ENGINE.batching.but(default=GATE_BATCHING),
    RUN.warmup,
    BACKEND.peers.but(default=GATE_PEERS),
    WORKLOAD.workload_param,
    RUN.cpu_threads,
    RUN.like,
)
# the gate's options, in --help order: its own (and perf's --label, for its own CSV), then those it forwards
GATE_OPTIONS = (
    GATE.base,
    GATE.head,
    GATE.base_url,
    GATE.head_url,
    GATE.repeats,
    GATE.max_repeats,
    GATE.on_inconclusive,
    GATE.min_effect,
    GATE.min_effect_file,
    GATE.confidence,
    GATE.output,
    OUTPUT.label,
    GATE.format,
    GATE.summary,
    GATE.run_timeout,
    GATE.quiet,
    GATE.dry_run,
    *FORWARDED,
)
# made absolute when they name something on disk
PATH_OPTIONS = frozenset(o.name for o in (RUN.like, WORKLOAD.dataset_path, ENGINE.model, WORKLOAD.tokenizer))


def _value(v: Any, cwd: Path, name: str) -> str:
    text = str(v)
    if name in PATH_OPTIONS and (cwd / text).exists():
        return str((cwd / text).resolve())
    return text


def forwarded_args(ctx: typer.Context, values: Values, cwd: Path) -> list[str]:
    """The perf options given on the gate's command line, spelled as perf reads them, plus the gate's own defaults
    for batching and peers (unless --like fixes both)."""
    given = set(explicit_params(ctx))
    names = {o.name for o in FORWARDED} | set(knob_names(exclude=("batching",)))
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
    if RUN.like.name not in given:
        out += [] if ENGINE.batching.name in given else [ENGINE.batching.flag, GATE_BATCHING]
        out += [] if BACKEND.peers.name in given else [BACKEND.peers.flag, GATE_PEERS]
        if WORKLOAD.num_prompts.name not in given and DeviceSpec.parse(values[DEVICE.device]).is_cpu:
            out += [WORKLOAD.num_prompts.flag, str(GATE_CPU_NUM_PROMPTS)]
    return out


def _device(device: str, like: Path | None) -> str:
    """The device the runs use: --like's (its rows name it), else --device."""
    if like is None:
        return device
    from cbbench.perf.results.rows import read_rows  # (the command's work: not at --help)

    return str(read_rows(like)[0].get("device") or "cpu")


@one_line_errors("gate")
@engine_knob_options(sweep=True, exclude=("batching",))
@takes(GATE_OPTIONS)
def gate(ctx: typer.Context, *, values: Values, knobs: KnobGrid = NO_GRID) -> None:
    """Gate a change: base and head measured in one job, interleaved, and a stated test per metric. No baseline file.

    Exit 0: no regression; 1: a regression (significant, in the bad direction, beyond the minimum effect) or a failed head run; 2: bad input or a failed base run; 3: inconclusive, unless --on-inconclusive pass; 128 + N: ended by signal N (docs/gate.md)."""
    from cbbench.perf.gate import signals as sig  # (the command's work: not at --help)
    from cbbench.perf.gate.arms import HEAD, ArmFailed  # (the command's work: not at --help)

    with sig.handled():
        try:
            code = _gate(ctx, values, Console(soft_wrap=True, width=max(100, Console().width)))
        except ArmFailed as e:
            err.print(f"cbbench gate: error: {e}", markup=False, soft_wrap=True)
            raise typer.Exit(1 if e.arm == HEAD else 2) from None
        except sig.Interrupted as e:
            why = str(e.args[0]) if e.args else ""
            err.print(f"cbbench gate: interrupted ({why})", markup=False, soft_wrap=True)
            raise typer.Exit(e.exit_code) from None
    raise typer.Exit(code)


def _gate(ctx: typer.Context, values: Values, console: Console) -> int:
    from cbbench.perf.gate.run import GateOptions, default_repeats, run_gate  # (the command's work: not at --help)

    cwd = Path.cwd()
    perf_args = forwarded_args(ctx, values, cwd)
    servers = values[GATE.base_url] is not None or values[GATE.head_url] is not None
    backend = BACKEND.backend
    if servers and backend.name not in explicit_params(ctx):
        perf_args = [backend.flag, values[backend], *perf_args]
    elif not servers and backend.name in explicit_params(ctx):
        raise ValueError("--backend is for two servers (--base-url / --head-url); a tree's runs are in-process")
    runs_on = _device(values[DEVICE.device], values[RUN.like])
    repeats = values[GATE.repeats]
    opts = GateOptions(
        base=values[GATE.base],
        head=values[GATE.head],
        base_url=values[GATE.base_url],
        head_url=values[GATE.head_url],
        perf_args=tuple(perf_args),
        model=values[ENGINE.model] if servers else None,
        device=runs_on,
        repeats=repeats if repeats is not None else default_repeats(runs_on),
        max_repeats=values[GATE.max_repeats],
        on_inconclusive=values[GATE.on_inconclusive],
        confidence=values[GATE.confidence],
        min_effect=values.every(GATE.min_effect),
        min_effect_files=values.every(GATE.min_effect_file),
        output=values[GATE.output],
        label=values[OUTPUT.label],
        format=values[GATE.format],
        summary=values[GATE.summary],
        run_timeout=values[GATE.run_timeout],
        quiet=values[GATE.quiet],
        dry_run=values[GATE.dry_run],
        cwd=cwd,
    )
    return run_gate(opts, console, err)
