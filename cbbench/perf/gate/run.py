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

import contextlib
import datetime as _dt
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from cbbench.perf.client_lag import arms_lag_notes
from cbbench.perf.gate import signals as sig
from cbbench.perf.gate import trees as tr
from cbbench.perf.gate.arms import (
    BASE,
    HEAD,
    Arm,
    ArmFailed,
    Run,
    check_repeat_count,
    perf_argv,
    preflight,
    run_once,
    run_order,
)
from cbbench.perf.gate.output import Outputs, check_target
from cbbench.perf.gate.report import (
    FORMATS,
    Unfinished,
    Verdict,
    message,
    render_error,
    render_json,
    render_markdown,
    render_text,
)
from cbbench.perf.gate.servers import check_servers
from cbbench.perf.gate.soundness import describe as describe_problems
from cbbench.perf.gate.soundness import run_problems
from cbbench.perf.gate.verdict import (
    DEFAULT_CONFIDENCE,
    Decision,
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
from cbbench.perf.results.rows import number, read_rows
from cbbench.perf.results.run_json import read_run
from refengine.sim.sim_device import DeviceSpec

# Runs per arm. A real device: 20, the most that keeps a CPU gate of the default run (16 ShareGPT prompts, ~11 CPU s
# a run) within 10 minutes of CPU time; the rates it gives are measured in docs/gate.md. A simulated device repeats
# its numbers to the digit, so noise needs no repeats: 7 is the least with which a change can be significant over up
# to 25 configurations of the 7 default metrics (1 / C(14, 7) = 0.0003 <= 0.05 / 175).
DEFAULT_REPEATS = 20
SIM_REPEATS = 7
# Each run's time limit (`--run-timeout` sets one for every run). A hung run must not hold a CI job for ever, and a
# slow one is not hung: until a run has finished its size is unknown, so the first runs get an hour (the default
# GPU gate's run takes minutes); after that, ten times the slowest finished run (a shared CPU stretched one run 3x
# against the next, docs/gate.md), and never less than five minutes.
FIRST_RUN_LIMIT_S = 3600.0
RUN_LIMIT_FACTOR = 10.0
MIN_RUN_LIMIT_S = 300.0
MAX_RUN_LIMIT_S = 7 * 24 * 3600.0


ON_INCONCLUSIVE = ("fail", "pass")  # what an inconclusive gate exits with: EXIT_INCONCLUSIVE, or 0
EXIT_INCONCLUSIVE = 3
BLOCK = 2  # runs per arm added at a time: one ABBA block (base head head base), so the order stays balanced


def looks(repeats: int, max_repeats: int | None) -> int:
    """How many times a gate may decide: once after `repeats` runs per arm, and once more per block it may add."""
    if max_repeats is None or max_repeats <= repeats:
        return 1
    return 1 + -(-(max_repeats - repeats) // BLOCK)


def default_repeats(device: str | None) -> int:

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
    run_timeout: float | None = None  # seconds per run; None: `run_limit`'s default from the runs' size
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
        check_repeat_count(self.repeats)
        if self.run_timeout is not None and not 0 < self.run_timeout <= MAX_RUN_LIMIT_S:
            raise ValueError(f"run-timeout must be in (0, {MAX_RUN_LIMIT_S:.0f}] seconds, got {self.run_timeout}")
        for what, text in (
            ("base", self.base),
            ("head", self.head),
            ("base-url", self.base_url),
            ("head-url", self.head_url),
        ):
            if text is not None and any(c in text for c in "\n\r\x00"):
                raise ValueError(f"{what}: {text!r} holds a line break or NUL; name one revision or URL")
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
    """The default output's name as `--dry-run` prints it (a real gate reserves `gate-TIME-PID.csv`, unique)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return cwd / "results" / f"gate-{stamp}-{os.getpid()}.csv"


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
            made.append((repo, tr.planned(name, rev, sha, scratch / name)))  # (before git starts: see check_out)
            tree = tr.check_out(repo, name, rev, sha, scratch / name)
        env = {} if o.dry_run else tr.arm_environment(tr.import_root(tree, scratch))
        arms[name] = Arm(name, tree.name, tree.root, env, tree=tree)
    return arms


def _server_arms(o: GateOptions, scratch: Path) -> tuple[dict[str, Arm], str]:

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
    output = o.output
    if output is not None and not output.is_absolute():
        output = o.cwd / output
    if o.dry_run:
        output = output if output is not None else default_output(o.cwd)
        check_target(output)
        outputs = None
    else:
        outputs = Outputs.reserve(output, o.summary, o.cwd / "results")
        output = outputs.csv
    made: list[tuple[Path, tr.Tree]] = []
    runs: list[Run] = []
    describe: dict[str, str] = {}
    try:
        with tr.scratch_folder() as scratch:
            try:
                perf_args = list(o.perf_args)
                if o.servers:
                    arms, model = _server_arms(o, scratch)
                    if o.model is None:
                        perf_args += ["--model", model]
                else:
                    arms = _tree_arms(o, scratch, made)
                describe = {name: arm.describe for name, arm in arms.items()}
                if o.dry_run:
                    _print_plan(console, o, arms, perf_args, output)
                    return 0
                assert outputs is not None
                configs = 0
                for arm in arms.values():
                    if arm.tree is not None:
                        tr.check_imports(arm.tree, dict(arm.env))
                        tr.compile_tree(arm.tree)
                    configs = max(configs, preflight(arm, perf_args, scratch / "preflight"))
                if configs > 1:  # a sweep: every configuration's tests count, before the first measured run
                    check_repeats(o.repeats, count_tests(configs, effects, n_looks), o.confidence)
                decisions, alpha = _measure_and_decide(
                    o, arms, perf_args, scratch, err, effects, n_looks, runs, outputs
                )
                summary = _summary(o, decisions, alpha, describe, runs, sources, output, time.perf_counter() - t0)
                _write_runs(outputs, runs, describe, summary, o.label)  # (the runs' own files are in the scratch)
            except ArmFailed as e:  # (here: the failed run's stderr is still in the scratch folder)
                assert outputs is not None
                kept = outputs.keep_log(e.log, e.arm, _failed_index(e))
                failed = _error_summary(o, describe, e, runs, output, time.perf_counter() - t0, kept)
                _write_runs(outputs, runs, describe, failed, o.label)
                outputs.release()
                _report_error(console, o, failed)
                raise ArmFailed(e.arm, _with_kept(str(e), outputs), log=kept) from None
            finally:
                with sig.deferred():
                    for repo, tree in made:
                        tr.remove(repo, tree)
    except ArmFailed:
        raise
    except BaseException as e:
        if outputs is not None:
            outputs.release()  # (nothing kept unless a run finished)
            note = outputs.kept_note()
            if note and isinstance(e, (KeyboardInterrupt, ValueError)):
                e.args = ((f"{e.args[0]}: " if e.args and e.args[0] else "") + note,)
        raise
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
    runs: list[Run],
    outputs: Outputs,
) -> tuple[list[Decision], float]:
    """The runs in ABBA order (into `runs`, each written as it finishes) and the decision on them; while the decision
    is inconclusive and --max-repeats allows, one more ABBA block and the decision again."""
    repeats = o.repeats
    most = max(o.max_repeats or repeats, repeats)
    _measure(o, arms, perf_args, scratch, err, effects, runs, outputs, run_order(repeats), n_looks)
    while True:
        base, head = [r.rows for r in runs if r.arm == BASE], [r.rows for r in runs if r.arm == HEAD]
        decisions, alpha = decide(base, head, effects, o.confidence, n_looks)
        if not inconclusive(decisions) or repeats >= most:
            return decisions, alpha
        more = min(BLOCK, most - repeats)
        if not o.quiet:
            err.print(f"gate: inconclusive after {repeats} runs per arm; {more} more per arm", markup=False)
        order = run_order(repeats + more)[2 * repeats :]
        _measure(o, arms, perf_args, scratch, err, effects, runs, outputs, order, n_looks)
        repeats += more


def _failed_index(e: ArmFailed) -> int:
    """The run index of a failed run, from its log's name (`head-002.err`): for the kept copy's name."""
    try:
        return int(e.log.stem.rsplit("-", 1)[1]) if e.log is not None else 0
    except (IndexError, ValueError):
        return 0


def _with_kept(message: str, outputs: Outputs) -> str:
    note = outputs.kept_note()
    return message + (f" ({note})" if note else "")


def _write_runs(
    outputs: Outputs, runs: Sequence[Run], describe: dict[str, str], summary: Verdict | Unfinished, label: str
) -> None:
    if runs:
        with sig.deferred():
            outputs.write(runs, describe, _gate_record(summary, runs), label)


def run_limit(finished: Sequence[Run], given: float | None) -> float:
    """The time limit of the next run: `--run-timeout` when given; else, from the size of the runs seen so far,
    `RUN_LIMIT_FACTOR` times the slowest finished run (at least `MIN_RUN_LIMIT_S`), or `FIRST_RUN_LIMIT_S` before
    any has finished."""
    if given is not None:
        return given
    if not finished:
        return FIRST_RUN_LIMIT_S
    return max(MIN_RUN_LIMIT_S, RUN_LIMIT_FACTOR * max(r.wall_s for r in finished))


def _measure(
    o: GateOptions,
    arms: dict[str, Arm],
    perf_args: Sequence[str],
    scratch: Path,
    err: Console,
    effects: dict[str, float],
    runs: list[Run],
    outputs: Outputs,
    order: Sequence[tuple[str, int]],
    n_looks: int,
) -> None:
    """The runs of `order` (ABBA) into `runs`, each checked (its tree, its soundness) and written to `outputs` as it
    finishes. ArmFailed on the first run that fails."""

    describe = {name: arm.describe for name, arm in arms.items()}
    for k, (name, index) in enumerate(order, start=1):
        arm = arms[name]
        run = run_once(arm, index, perf_args, scratch / "runs", read_rows, run_limit(runs, o.run_timeout))
        _check_ran(arm, run)
        _check_sound(arm, run)
        for row in run.rows:  # (the whole process's, on every row of the run: gated once per run)
            row["process_cpu_s"] = run.cpu_s
        if k == 1 and index == 0:  # the number of configurations is known now: every test counts
            check_repeats(o.repeats, count_tests(len(run.rows), effects, n_looks), o.confidence)
        runs.append(run)
        partial: Unfinished = {
            **_PARTIAL,
            "base": describe[BASE],
            "head": describe[HEAD],
            "repeats": o.repeats,
            "finished": len(runs),
        }
        _write_runs(outputs, runs, describe, partial, o.label)
        _progress(err, o.quiet, k, len(order), run, arm)


# the summary of a gate still running (the pair is rewritten after every run; the last write has the verdict)
_PARTIAL: Unfinished = {
    "order": "ABBA",
    "test": "",
    "tests": 0,
    "confidence": None,
    "alpha": None,
    "regressed": None,
    "inconclusive": None,
    "message": "unfinished: the gate was still running",
}


def _check_sound(arm: Arm, run: Run) -> None:
    """ArmFailed when the run had failed requests or a figure no sound run makes (soundness.py)."""

    try:
        records = read_run(run.csv.with_suffix(".json")).get("records")
    except (ValueError, OSError) as e:
        what = f"{arm.name} run {run.index + 1} ({arm.describe})"
        raise ArmFailed(arm.name, f"{what}: its records do not read: {e}", log=run.csv.with_suffix(".err")) from None
    problems = run_problems(run.rows, records if isinstance(records, dict) else None)
    if problems:
        raise ArmFailed(
            arm.name,
            f"{arm.name} run {run.index + 1} ({arm.describe}) is not sound, so the gate cannot judge it: "
            + describe_problems(problems),
            log=run.csv.with_suffix(".err"),
        )


def _error_summary(
    o: GateOptions,
    describe: dict[str, str],
    e: ArmFailed,
    runs: Sequence[Run],
    output: Path,
    wall_s: float,
    kept: Path | None,
) -> Unfinished:
    """The verdict of a gate an arm's failure ended: the arm and why, never a ratio."""
    line = f"ERROR: the {e.arm} arm failed: {e}"
    return {
        **_PARTIAL,
        "base": describe.get(BASE, ""),
        "head": describe.get(HEAD, ""),
        "repeats": o.repeats,
        "regressed": e.arm == HEAD,
        "message": line,
        "error": {"arm": e.arm, "message": str(e), "stderr": str(kept) if kept else None},
        "finished": len(runs),
        "output": str(output) if runs else None,
        "wall_s": wall_s,
    }


def _report_error(console: Console, o: GateOptions, summary: Unfinished) -> None:
    if o.summary is not None:
        with contextlib.suppress(OSError), o.summary.open("a") as f:
            f.write(render_error(summary, "markdown"))
    console.file.write(render_error(summary, o.format))


def _summary(
    o: GateOptions,
    decisions: Sequence[Decision],
    alpha: float,
    describe: dict[str, str],
    runs: Sequence[Run],
    sources: list[str],
    output: Path,
    wall_s: float,
) -> Verdict:
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


def _gate_record(summary: Verdict | Unfinished, runs: Sequence[Run]) -> dict[str, object]:
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
    fields: Mapping[str, object] = summary
    return {
        **{k: fields[k] for k in keep},
        "runs": [
            {
                "arm": r.arm,
                "index": r.index,
                "wall_s": r.wall_s,
                "cpu_s": r.cpu_s,
                "failed": sum(int(v) for row in r.rows if math.isfinite(v := number(row.get("failed")))),
                "sound": True,  # (every run kept passed soundness.py's checks; the first that did not ended the gate)
            }
            for r in runs
        ],
    }


def _report(console: Console, o: GateOptions, decisions: Sequence[Decision], summary: Verdict) -> None:
    if o.summary is not None:
        try:
            with o.summary.open("a") as f:
                f.write(render_markdown(decisions, summary))
        except OSError as e:  # (checked before the first run; the runs are in the output whatever this says)
            raise ValueError(
                f"summary: cannot append to {o.summary} ({e.strerror}); the runs are in {summary['output']}"
            ) from None
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
