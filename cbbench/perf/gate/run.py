"""`cbbench gate`: what it is asked (`GateOptions`), and the whole gate in order (`run_gate`):

1. the minimum effects and the output are checked, and the trees resolved (a revision that does not exist, a dirty
   work tree where `--head` names its own commit, two servers that serve different models: one line, exit 2);
2. each revision is checked out once as a detached worktree in a temporary folder (removed at the end, on an error
   or Ctrl-C too), and a fresh interpreter confirms where each arm imports cbbench from;
3. each arm's perf reads the options once (`perf --dry-run`): an option a tree's perf does not know stops the gate
   before any run, naming the arm and its error line;
4. the runs, one process at a time in ABBA order (arms.py), each checked to have run its own tree (`git_sha`);
5. the decision (verdict.py), the results pair (output.py, written whole or not at all) and the report (report.py).
Between 4 and 5, a gate whose verdict is inconclusive (verdict.py) adds one ABBA block at a time (two runs per arm)
while it stays so, up to --max-repeats runs per arm (Chromium pinpoint's "need more runs").
Exit 0: no regression (or inconclusive with --on-inconclusive pass); 1: a regression, or the head arm failed to run;
2: bad input, or the base arm failed; 3: inconclusive (--on-inconclusive fail, the default).
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from cbbench.perf.client_lag import arms_lag_notes
from cbbench.perf.gate import trees as tr
from cbbench.perf.gate.arms import BASE, HEAD, Arm, Run, perf_argv, preflight, run_once, run_order
from cbbench.perf.gate.output import check_target, write_pair
from cbbench.perf.gate.report import FORMATS, message, render_json, render_markdown, render_text
from cbbench.perf.gate.verdict import (
    DEFAULT_CONFIDENCE,
    check_repeats,
    configurations,
    count_tests,
    decide,
    default_min_effects,
    inconclusive,
    key_changes,
    min_effects,
    regressed,
)

# Runs per arm. A real device: 20, the most that keeps a CPU gate of the default run (16 ShareGPT prompts, ~11 CPU s
# a run) within 10 minutes of CPU time; the rates it gives are measured in docs/gate.md. A simulated device repeats
# its numbers to the digit, so noise needs no repeats: 7 is the least with which a change can be significant over up
# to 25 configurations of the 7 default metrics (1 / C(14, 7) = 0.0003 <= 0.05 / 175).
DEFAULT_REPEATS = 20
SIM_REPEATS = 7


ON_INCONCLUSIVE = ("fail", "pass")  # what an inconclusive gate exits with: EXIT_INCONCLUSIVE, or 0
EXIT_INCONCLUSIVE = 3
BLOCK = 2  # runs per arm added at a time: one ABBA block (base head head base), so the order stays balanced


def looks(repeats: int, max_repeats: int | None) -> int:
    """How many times a gate may decide: once after `repeats` runs per arm, and once more per block it may add."""
    if max_repeats is None or max_repeats <= repeats:
        return 1
    return 1 + -(-(max_repeats - repeats) // BLOCK)


def default_repeats(device: str | None) -> int:
    from refengine.sim.sim_device import DeviceSpec

    return SIM_REPEATS if device is not None and DeviceSpec.parse(device).simulated else DEFAULT_REPEATS


@dataclass(frozen=True)
class GateOptions:
    """What to gate (two revisions of the repository at `cwd`, or two servers), how the arms run (`perf_args`,
    passed to every run's `cbbench perf`) and how the verdict is reached and reported."""

    base: str | None = None
    head: str | None = None  # None: the work tree, uncommitted changes included
    base_url: str | None = None
    head_url: str | None = None
    perf_args: tuple[str, ...] = ()
    model: str | None = None  # the servers' model (--model), when given
    device: str = "cpu"  # the runs' device (--device, or --like's): which metrics are gated by default
    repeats: int = DEFAULT_REPEATS  # (`default_repeats` of the device when the command line names none)
    max_repeats: int | None = None  # add runs to an inconclusive verdict, up to this many per arm (None: none added)
    on_inconclusive: str = "fail"  # ON_INCONCLUSIVE
    confidence: float = DEFAULT_CONFIDENCE
    min_effect: tuple[str, ...] = ()
    min_effect_files: tuple[str, ...] = ()
    output: Path | None = None
    label: str = ""
    format: str = "text"
    summary: Path | None = None
    quiet: bool = False
    dry_run: bool = False
    cwd: Path = field(default_factory=Path.cwd)

    def __post_init__(self) -> None:
        servers = self.base_url is not None or self.head_url is not None
        if servers and (self.base is not None or self.head is not None):
            raise ValueError("gate: give --base/--head (two trees) or --base-url/--head-url (two servers), not both")
        if servers and (self.base_url is None or self.head_url is None):
            raise ValueError("gate: --base-url and --head-url go together (the two servers to measure)")
        if not servers and self.base is None:
            raise ValueError("gate: --base REV is missing (the revision to gate against, e.g. --base main)")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(f"max-repeats: {self.max_repeats} is below --repeats {self.repeats}")
        if self.on_inconclusive not in ON_INCONCLUSIVE:
            raise ValueError(
                f"on-inconclusive must be one of {', '.join(ON_INCONCLUSIVE)}, got {self.on_inconclusive!r}"
            )
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")

    @property
    def servers(self) -> bool:
        return self.base_url is not None


def default_output(cwd: Path) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return cwd / "results" / f"gate-{stamp}.csv"


def _tree_arms(o: GateOptions, scratch: Path, made: list[tuple[Path, tr.Tree]]) -> dict[str, Arm]:
    """Both arms of a tree gate; each worktree made is appended to `made` as soon as it exists (for removal)."""
    repo = tr.repo_root(o.cwd)
    base_sha = tr.resolve(repo, str(o.base), "--base")
    head_sha = tr.resolve(repo, o.head, "--head") if o.head is not None else None
    if head_sha is not None and head_sha == tr.head_sha(repo) and tr.dirty(repo):
        raise ValueError(
            f"--head {o.head} is the work tree's commit, and the work tree has uncommitted changes the gate would "
            "leave out: commit or stash them, or leave out --head to gate the work tree as it is"
        )
    arms = {}
    for name, rev, sha in ((BASE, str(o.base), base_sha), (HEAD, o.head, head_sha)):
        if rev is None or sha is None:
            tree = tr.work_tree(repo, name)
        elif o.dry_run:  # the plan only: nothing is checked out
            tree = tr.Tree(name, rev, sha, scratch / name, checked_out=False)
        else:
            tree = tr.check_out(repo, name, rev, sha, scratch / name)
            made.append((repo, tree))
        env = {} if o.dry_run else tr.arm_environment(tr.import_root(tree, scratch))
        arms[name] = Arm(name, tree.name, tree.root, env, tree=tree)
    return arms


def _server_arms(o: GateOptions, scratch: Path) -> tuple[dict[str, Arm], str]:
    from cbbench.perf.gate.servers import check_servers

    assert o.base_url is not None and o.head_url is not None  # (checked by GateOptions)
    model = check_servers(o.base_url, o.head_url, o.model)
    arms = {
        name: Arm(name, url, scratch, dict(os.environ), args=("--base-url", url), url=url)
        for name, url in ((BASE, o.base_url), (HEAD, o.head_url))
    }
    return arms, model


def _progress(err: Console, quiet: bool, k: int, total: int, run: Run, arm: Arm) -> None:
    if quiet:
        return
    tput = [r.get("output_throughput") for r in run.rows]
    shown = ", ".join(f"{float(t):.1f}" for t in tput if isinstance(t, (int, float)))
    err.print(
        f"gate [{k}/{total}] {arm.name} {arm.describe}: {run.wall_s:.1f} s, {run.cpu_s:.1f} CPU s"
        + (f", output tok/s {shown}" if shown else ""),
        markup=False,
        highlight=False,
    )


def _check_ran(arm: Arm, run: Run) -> None:
    """ValueError when a run's rows say another tree's code made them (the import path was shadowed)."""
    if arm.tree is None:
        return
    for row in run.rows:
        sha = str(row.get("git_sha") or "")
        if not arm.tree.ran_this(sha):
            raise ValueError(
                f"gate: the {arm.name} arm's run recorded git_sha {sha}, not {arm.tree.sha[:12]}: "
                f"it ran another tree's code"
            )


def run_gate(o: GateOptions, console: Console, err: Console) -> int:
    """The whole gate (module docstring); returns the exit code. Bad input raises ValueError (exit 2)."""
    t0 = time.perf_counter()
    defaults = default_min_effects(o.device, o.servers)
    effects, sources = min_effects(o.min_effect, o.min_effect_files, cwd=o.cwd, defaults=defaults)
    n_looks = looks(o.repeats, o.max_repeats)
    check_repeats(o.repeats, count_tests(1, effects, n_looks), o.confidence)
    output = o.output if o.output is not None else default_output(o.cwd)
    if not output.is_absolute():
        output = o.cwd / output
    check_target(output)
    made: list[tuple[Path, tr.Tree]] = []
    with tr.scratch_folder() as scratch:
        try:
            perf_args = list(o.perf_args)
            if o.servers:
                arms, model = _server_arms(o, scratch)
                if o.model is None:
                    perf_args += ["--model", model]
            else:
                arms = _tree_arms(o, scratch, made)
            if o.dry_run:
                _print_plan(console, o, arms, perf_args, output)
                return 0
            for arm in arms.values():
                if arm.tree is not None:
                    tr.check_imports(arm.tree, dict(arm.env))
                    tr.compile_tree(arm.tree)
                preflight(arm, perf_args, scratch / "preflight")
            runs, decisions, alpha = _measure_and_decide(o, arms, perf_args, scratch, err, effects, n_looks)
        finally:
            for repo, tree in made:
                tr.remove(repo, tree)
        describe = {name: arm.describe for name, arm in arms.items()}
        summary = _summary(o, decisions, alpha, describe, runs, sources, output, time.perf_counter() - t0)
        write_pair(output, runs, describe, _gate_record(summary, runs), o.label)
    _report(console, o, decisions, summary)
    if summary["regressed"]:
        return 1
    if summary["inconclusive"] and o.on_inconclusive == "fail":
        return EXIT_INCONCLUSIVE
    return 0


def _measure_and_decide(
    o: GateOptions,
    arms: dict[str, Arm],
    perf_args: Sequence[str],
    scratch: Path,
    err: Console,
    effects: dict[str, float],
    n_looks: int,
) -> tuple[list[Run], list[Any], float]:
    """The runs in ABBA order and the decision on them; while the decision is inconclusive and --max-repeats
    allows, one more ABBA block and the decision again."""
    repeats = o.repeats
    most = max(o.max_repeats or repeats, repeats)
    runs = _measure(o, arms, perf_args, scratch, err, effects, run_order(repeats), n_looks)
    while True:
        base, head = [r.rows for r in runs if r.arm == BASE], [r.rows for r in runs if r.arm == HEAD]
        decisions, alpha = decide(base, head, effects, o.confidence, n_looks)
        if not inconclusive(decisions) or repeats >= most:
            return runs, decisions, alpha
        more = min(BLOCK, most - repeats)
        if not o.quiet:
            err.print(f"gate: inconclusive after {repeats} runs per arm; {more} more per arm", markup=False)
        runs += _measure(o, arms, perf_args, scratch, err, effects, run_order(repeats + more)[2 * repeats :], n_looks)
        repeats += more


def _measure(
    o: GateOptions,
    arms: dict[str, Arm],
    perf_args: Sequence[str],
    scratch: Path,
    err: Console,
    effects: dict[str, float],
    order: Sequence[tuple[str, int]],
    n_looks: int,
) -> list[Run]:
    from cbbench.perf.results.rows import read_rows

    runs: list[Run] = []
    for k, (name, index) in enumerate(order, start=1):
        arm = arms[name]
        run = run_once(arm, index, perf_args, scratch / "runs", lambda p: read_rows(p))
        _check_ran(arm, run)
        for row in run.rows:  # (the whole process's, on every row of the run: gated once per run)
            row["process_cpu_s"] = run.cpu_s
        if k == 1 and index == 0:  # the number of configurations is known now: every test counts
            check_repeats(o.repeats, count_tests(len(run.rows), effects, n_looks), o.confidence)
        runs.append(run)
        _progress(err, o.quiet, k, len(order), run, arm)
    return runs


def _summary(
    o: GateOptions,
    decisions: Sequence[Any],
    alpha: float,
    describe: dict[str, str],
    runs: Sequence[Run],
    sources: list[str],
    output: Path,
    wall_s: float,
) -> dict[str, Any]:
    base = [r.rows for r in runs if r.arm == BASE]
    head = [r.rows for r in runs if r.arm == HEAD]
    notes = []
    for name, b, h in zip(configurations(base, head), base[0], head[0]):
        changed = key_changes(b, h)
        if changed:
            notes.append(f"{name}: the arms resolved the configuration differently ({'; '.join(changed)})")
    notes += arms_lag_notes(configurations(base, head), base, head)
    return {
        "base": describe[BASE],
        "head": describe[HEAD],
        "regressed": regressed(decisions),
        "inconclusive": inconclusive(decisions),
        "message": message(decisions),
        "repeats": min(len(base), len(head)),
        "max_repeats": o.max_repeats,
        "looks": looks(o.repeats, o.max_repeats),
        "order": "ABBA",
        "test": "Mann-Whitney U on log values, Hodges-Lehmann ratio, Bonferroni",
        "tests": len(decisions),
        "confidence": o.confidence,
        "alpha": alpha,
        "min_effect_sources": sources,
        "notes": notes,
        "output": str(output),
        "wall_s": wall_s,
        "cpu_s": {arm: sum(r.cpu_s for r in runs if r.arm == arm) for arm in (BASE, HEAD)},
    }


def _gate_record(summary: dict[str, Any], runs: Sequence[Run]) -> dict[str, Any]:
    """What the results JSON keeps of the gate (its `config.gate`): the arms, the test and every run's cost."""
    keep = (
        "base",
        "head",
        "repeats",
        "order",
        "test",
        "tests",
        "confidence",
        "alpha",
        "regressed",
        "inconclusive",
        "message",
    )
    return {
        **{k: summary[k] for k in keep},
        "runs": [{"arm": r.arm, "index": r.index, "wall_s": r.wall_s, "cpu_s": r.cpu_s} for r in runs],
    }


def _report(console: Console, o: GateOptions, decisions: Sequence[Any], summary: dict[str, Any]) -> None:
    if o.summary is not None:
        with o.summary.open("a") as f:
            f.write(render_markdown(decisions, summary))
    if o.format == "json":
        console.file.write(render_json(decisions, summary) + "\n")
    elif o.format == "markdown":
        console.file.write(render_markdown(decisions, summary))
    else:
        console.print(render_text(decisions, summary))


def _print_plan(console: Console, o: GateOptions, arms: dict[str, Arm], perf_args: Sequence[str], output: Path) -> None:
    """`--dry-run`: the arms, the order and each arm's command; nothing is checked out or run."""
    order = " ".join(("B" if a == BASE else "H") for a, _ in run_order(o.repeats))
    console.print(f"gate: base {arms[BASE].describe} -> head {arms[HEAD].describe}", markup=False)
    console.print(f"order ({o.repeats} runs per arm, one at a time): {order}", markup=False, soft_wrap=True)
    if o.max_repeats is not None and o.max_repeats > o.repeats:
        console.print(
            f"while inconclusive: {BLOCK} more runs per arm at a time (ABBA), up to {o.max_repeats} per arm",
            markup=False,
        )
    for arm in arms.values():
        argv = perf_argv(perf_args, arm, Path("RUN.csv"))
        console.print(f"{arm.name}: {' '.join(argv[1:])}  (in {arm.cwd})", markup=False, soft_wrap=True)
    console.print(f"results to {output}", markup=False)
