"""What a user sees, recorded: a fixed list of `cbbench` commands, each run in a fresh temporary working folder, with
its exit code, stdout, stderr and every file it wrote, normalised so that two runs of the same code record the same
text (issue 48, item 7: "for the same inputs every command's table, files and messages are the same").

    python ci/user_scenarios.py record OUTDIR [--cbbench PATH] [--jobs N] [--only SUBSTRING]
    python ci/user_scenarios.py diff DIR_A DIR_B      # exit 0: identical; 1: a unified diff per differing scenario

`record` writes one text file per scenario (OUTDIR/NAME.txt) and OUTDIR/index.txt (the scenarios in order). The
cbbench executable is by default the one beside this Python's (a venv's bin/). Record the base and the branch on the
same machine, with the same venv's packages: the records keep what is the same from one run to the next there (the
CPU count the pool executor sizes itself by, the bundled dataset's version), and mask only what is not.

Masked, everywhere (it differs between two runs of the same code, or between two checkouts of it):
- paths: the scenario's temporary folder, the cbbench source tree, the venv, the home folder; the host name;
- wall-clock dates and times (ISO date-times, the time stamp in a default results file name), git shas (any 40 hex
  digits, and the source tree's and scratch repositories' HEAD shas, short ones too), process ids;
- the version of Python, the platform and each package (`environment` in the JSON, the report's environment table);
- the wall-clock figures beside the simulated ones: a simulated run's `sim_speed` wall seconds, "N s of worker
  time", "N simulated s per worker s", "in N s elapsed", a progress line's "N/M requests in N s" (or "N s on a
  worker") and its grid's rate and ETA, each gate run's "N s, N CPU s" and its rows' `process_cpu_s` (the
  process's CPU seconds), `sim validate`'s "in N s" per row; the heartbeat lines (one per 30 s of a run: there
  or not as the machine is slow or fast). A simulated run's own figures (latencies, throughputs, steps) come from
  a virtual clock and are kept to the digit;
- with `unordered` (runs on the pool of processes, sim:<gpu>'s default executor): the number of each run's
  record files, given in the order the workers finish (the files are named by the run's label instead), and the
  order of `sim_speed`'s runs.
Masked in the runs that measure the wall clock (a real CPU model, the micro-benchmarks; `timed` below): every
decimal number in the text and the integers with a time or rate unit, the table cells under a time or rate
header (with the table's padding, whose width follows the numbers), and in the files the columns and keys of
measured times and rates (`TIMED_FIELD`). Everything structural stays: column names, keys, row counts, messages,
exit codes.

Not recorded: `__pycache__` folders (the gate compiles its trees) and files outside the scenario's folder.
Standard library only, and pyarrow (a cbbench dependency) to read the Parquet records; without it a Parquet file is
recorded by its size.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import difflib
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- normalisation --------------------------------------------------------------------------------------------------

MASK = "<masked>"
ISO_DATETIME = re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?(?![\d:])")
FILE_STAMP = re.compile(r"\b20\d{6}[-_T]?\d{6}(-\d+)?\b")  # results/sharegpt-20261207-052719.csv, gate-...-PID
TEMP_NAME = re.compile(r"(<tmpdir>/[A-Za-z._-]*?)[a-z0-9_]{8}(?=[/\s'\"]|$)", re.M)  # mkdtemp's random suffix
HEX40 = re.compile(r"\b[0-9a-f]{40}\b")
PID = re.compile(r"\b(pid|PID|process)( ?[=:]? ?)\d+\b")
NUM = r"\d+(?:\.\d+)?(?:e[+-]?\d+)?"
# wall-clock figures that a simulated run prints beside its virtual ones
WALL_PHRASES = [
    (re.compile(rf"\bin {NUM} s of worker time"), "in <wall> s of worker time"),
    (re.compile(rf"\b{NUM} simulated s per worker s"), "<wall> simulated s per worker s"),
    (re.compile(rf"\bin {NUM} s elapsed"), "in <wall> s elapsed"),
    (re.compile(rf": {NUM} s, {NUM} CPU s,"), ": <wall> s, <wall> CPU s,"),  # gate [i/n] ...
    (re.compile(rf"\bin {NUM} s$", re.M), "in <wall> s"),  # sim validate's row lines
    (re.compile(rf"(\d+/\d+ requests) in {NUM} s\b"), r"\1 in <wall> s"),  # a run's progress line
    (re.compile(rf"(\d+ requests), {NUM} s on a worker"), r"\1, <wall> s on a worker"),  # ... on a pool
    (re.compile(rf"(\d+/\d+ runs), {NUM} runs/(?:s|min)(?:, (?:ETA|all in) [^|\n]*[^|\n ])?"), r"\1, <rate>"),
    # the heartbeat: a line every 30 s of a run or grid, so there or not as the machine is fast or slow
    (
        re.compile(r"^\.\.\. (?:\[\d+/\d+\] .*(?:warming up the engine, \d+ s|\d+ s elapsed)|\d+/\d+ runs).*\n?", re.M),
        "",
    ),
    (re.compile(r"^Matplotlib is building the font cache.*\n", re.M), ""),  # a first run on a machine, not cbbench's
]
# a timed run: numbers that come from the wall clock
TIMED_UNIT = re.compile(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)? ?(?:ms|us|µs|s|CPU s|tok/s|req/s|GB/s)(?![\w/])")
FLOAT = re.compile(r"(?<![\w.])\d+\.\d+(?:e[+-]?\d+)?x?(?![\w.])")
TIMED_HEADER = re.compile(r"tok/s|req/s|\bms\b|\bus\b|÷|ratio|\bs\b|gbps|speedup", re.I)
# file columns and JSON keys of measured times and rates (a timed run's; a simulated run keeps them)
TIMED_FIELD = re.compile(
    r"(_ms|_us|_s|_time|_times|throughput|goodput|gbps|frac_of_hbm|speedup_vs_sdpa|^duration|^achieved_request_rate"
    r"|^steady_(?!state_note).*|^time)$"
)
ENV_MASKED_KEY = re.compile(r"^(git_sha|python|platform|hostname|pid|\w+_version)$")
ALWAYS_MASKED_KEY = re.compile(
    r"^(git_sha|timestamp|wall_s|\w+_wall_s|cpu_s|process_cpu_s|pid|hostname|started_at|finished_at)$"
)
RUN_FILE = re.compile(r"^(?P<folder>.*\.records)/(?P<kind>runs|requests|steps)/run-(?P<n>\d+)\.(?P<ext>json|parquet)$")
BOX_ROW = re.compile(r"^[│┃]")


@dataclass
class Masks:
    """What to mask in one scenario's output: literal strings (a path, the host name) and their placeholder, shas,
    and whether its figures come from the wall clock (`timed`)."""

    literals: dict[str, str] = field(default_factory=dict)
    shas: set[str] = field(default_factory=set)
    timed: bool = False
    unordered: bool = False

    def text(self, s: str) -> str:
        for lit in sorted(self.literals, key=len, reverse=True):
            if lit:
                s = s.replace(lit, self.literals[lit])
        for sha in sorted(self.shas, key=len, reverse=True):
            if re.fullmatch(r"[0-9a-f]{40}", sha):
                s = re.sub(rf"\b{sha[:7]}[0-9a-f]{{0,33}}\b", "<sha>", s)
        s = HEX40.sub("<sha>", s)
        s = ISO_DATETIME.sub("<datetime>", s)
        s = FILE_STAMP.sub(lambda m: "<stamp>" + ("-<pid>" if m.group(1) else ""), s)
        s = TEMP_NAME.sub(r"\1<random>", s)
        s = PID.sub(r"\1\2<pid>", s)
        for pattern, repl in WALL_PHRASES:
            s = pattern.sub(repl, s)
        if self.timed:
            s = timed_text(s)
        return s


def timed_text(s: str) -> str:
    """A wall-clock run's text: its rich tables cell by cell (timed columns masked, padding dropped), then every
    decimal number and every number with a time or rate unit masked, and runs of spaces made one."""
    out, header = [], None
    for line in s.splitlines():
        if line.startswith("┃"):
            header = [c.strip() for c in line.strip("┃").split("┃")]
            out.append("| " + " | ".join(header) + " |")
            continue
        if BOX_ROW.match(line) and header is not None:
            cells = [c.strip() for c in line.strip("│").split("│")]
            if len(cells) == len(header):
                cells = [MASK if c and TIMED_HEADER.search(h) else c for h, c in zip(header, cells)]
            out.append("| " + " | ".join(cells) + " |")
            continue
        if line[:1] in "┏┡└╭╰":
            out.append(line[:1] + "-")  # a border: its width follows the cells
            continue
        line = TIMED_UNIT.sub(lambda m: "<t>" + m.group(0).lstrip("0123456789.e+-"), line)
        line = FLOAT.sub("<num>", line)
        out.append(re.sub(r"[ \t]+", " ", line).rstrip())
    return "\n".join(out) + ("\n" if s.endswith("\n") else "")


def mask_json(value: object, masks: Masks, key: str = "", in_env: bool = False) -> object:
    """A parsed JSON document with the varying values masked by key (see the module's docstring), strings by
    `masks.text`."""
    if isinstance(value, dict):
        env = in_env or key == "environment"
        items = value.items()
        if masks.unordered and key == "runs":  # sim_speed's runs, in the order the pool's workers finished them
            items = sorted(items)
        return {k: mask_json(v, masks, k, env) for k, v in items}
    if isinstance(value, list):
        return [mask_json(v, masks, key, in_env) for v in value]
    if value is None:
        return None
    if ALWAYS_MASKED_KEY.match(key) or (in_env and ENV_MASKED_KEY.match(key)):
        return MASK
    if masks.timed and isinstance(value, int | float) and not isinstance(value, bool) and TIMED_FIELD.search(key):
        return MASK
    if isinstance(value, str):
        return masks.text(value)
    return value


def render_json(text: str, masks: Masks) -> str:
    try:
        doc = json.loads(text)
    except ValueError:
        return masks.text(text)
    return json.dumps(mask_json(doc, masks), indent=1, ensure_ascii=False) + "\n"


def render_csv(text: str, masks: Masks) -> str:
    """A CSV as its header and then one `column = value` line per cell, row by row (a changed cell is one line of
    the diff); the masked columns' values replaced."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return "(empty)\n"
    header, body = rows[0], rows[1:]
    out = [f"columns ({len(header)}): {','.join(header)}", f"rows: {len(body)}"]
    for i, row in enumerate(body):
        out.append(f"-- row {i}")
        for j, cell in enumerate(row):
            name = header[j] if j < len(header) else f"#{j}"
            if ALWAYS_MASKED_KEY.match(name) or (masks.timed and cell and TIMED_FIELD.search(name)):
                cell = MASK
            elif cell[:1] in "{[":
                try:
                    cell = json.dumps(mask_json(json.loads(cell), masks), ensure_ascii=False)
                except ValueError:
                    cell = masks.text(cell)
            else:
                cell = masks.text(cell)
            out.append(f"{name} = {cell}")
    return "\n".join(out) + "\n"


def render_html(text: str, masks: Masks) -> str:
    """One tag per line (a report is a few long lines); the environment table's versions and sha masked."""
    text = re.sub(
        r"(<td>(?:git_sha|python|platform|hostname|\w+_version)</td><td>)[^<]*(</td>)", rf"\g<1>{MASK}\2", text
    )
    return masks.text(re.sub(r">\s*<", ">\n<", text)) + "\n"


def render_parquet(path: Path, masks: Masks) -> str:
    """A Parquet file as its schema, its row count and one digest of each column's values (a changed column is one
    line of the diff; a timed run's time columns masked)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return f"parquet, {path.stat().st_size} bytes (pyarrow not installed: contents not read)\n"
    table = pq.read_table(path)
    out = [f"rows: {table.num_rows}"]
    for name, column in zip(table.column_names, table.columns):
        kind = str(column.type)
        if masks.timed and TIMED_FIELD.search(name):
            out.append(f"{name}: {kind} = {MASK}")
            continue
        values = json.dumps(mask_json(column.to_pylist(), masks, name), ensure_ascii=False, default=str)
        out.append(f"{name}: {kind} = sha256:{hashlib.sha256(values.encode()).hexdigest()[:16]}")
    return "\n".join(out) + "\n"


def render_binary(data: bytes) -> str:
    head = ""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        head = f"PNG {int.from_bytes(data[16:20], 'big')}x{int.from_bytes(data[20:24], 'big')}, "
    return f"{head}{len(data)} bytes, sha256:{hashlib.sha256(data).hexdigest()[:16]}\n"


def render_file(path: Path, masks: Masks) -> str:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return render_parquet(path, masks)
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return render_binary(data)
    if suffix == ".csv":
        return render_csv(text, masks)
    if suffix == ".json":
        return render_json(text, masks)
    if suffix == ".jsonl":
        return "".join(render_json(line, masks) for line in text.splitlines() if line.strip())
    if suffix in (".html", ".htm"):
        return render_html(text, masks)
    return masks.text(text)


# --- scenarios ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One command: `args` after `cbbench`, run in a fresh folder that `setup` (if any) fills first (it gets the
    folder and the run's context; it may return the folder to run in and shas to mask); `needs`: the scenario
    whose folder (its inputs and outputs) is copied in first, as `in/`."""

    name: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    timed: bool = False
    unordered: bool = False
    needs: str | None = None
    setup: Callable[[Path, Context], tuple[Path, set[str]]] | None = None
    timeout: float = 600


@dataclass
class Context:
    cbbench: Path
    python: Path | None
    source: Path | None
    shas: set[str]
    scratch: Path  # the session's temporary folder (a scenario folder per scenario under it)


COMMANDS = [
    (),
    ("perf",),
    ("plan",),
    ("serve",),
    ("timeline",),
    ("plot",),
    ("report",),
    ("show",),
    ("compare",),
    ("gate",),
    ("generate",),
    ("kernels",),
    ("bench-scheduler",),
    ("bench-profile",),
    ("bench-step",),
    ("bench-async",),
    ("sim",),
    ("sim", "validate"),
]


def help_scenarios() -> list[Scenario]:
    out = []
    for cmd in COMMANDS:
        base = "help-" + ("-".join(cmd) or "cbbench")
        for width in (None, "80", "200"):
            env = (("COLUMNS", width),) if width else ()
            out.append(Scenario(base + (f"-c{width}" if width else ""), (*cmd, "--help"), env=env))
    return out


def _write(folder: Path, name: str, text: str) -> None:
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def _scaled_copy(src: Path, dst: Path, factors: dict[str, float], per_repeat: Sequence[float] = ()) -> None:
    """`src` (a results CSV) as `dst` with the named columns multiplied (a planted regression); `per_repeat`
    multiplies them once more by a factor per repeat (a planted spread)."""
    with src.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        spread = per_repeat[int(row.get("repeat") or 0) % len(per_repeat)] if per_repeat else 1.0
        for col, k in factors.items():
            if row.get(col) not in (None, "", "nan"):
                row[col] = repr(float(row[col]) * k * spread)
    with dst.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if src.with_suffix(".json").exists():
        shutil.copy(src.with_suffix(".json"), dst.with_suffix(".json"))


def setup_regressed(folder: Path, ctx: Context) -> tuple[Path, set[str]]:
    _scaled_copy(folder / "in/out/sharegpt.csv", folder / "slower.csv", {"output_throughput": 0.8, "mean_ttft_ms": 1.3})
    return folder, set()


def setup_spread(folder: Path, ctx: Context) -> tuple[Path, set[str]]:
    _scaled_copy(
        folder / "in/out/repeats.csv",
        folder / "spread.csv",
        {"output_throughput": 1.0},
        per_repeat=(0.9, 1.1, 0.97, 1.06),
    )
    return folder, set()


def setup_bad_files(folder: Path, ctx: Context) -> tuple[Path, set[str]]:
    _write(folder, "garbage.csv", "this is not,a results file\n1,2,3,4\n\x00\x01")
    _write(folder, "empty.csv", "")
    _write(folder, "bad.json", "{not json")
    _write(folder, "prompts.jsonl", '{"prompt": "hello", "output_len": 4}\n[1, 2]\n')
    return folder, set()


def setup_trace(folder: Path, ctx: Context) -> tuple[Path, set[str]]:
    lines = ["timestamp,input_len,output_len"] + [f"{i * 0.05:.2f},{64 + 16 * i},{32 + 8 * (i % 3)}" for i in range(12)]
    _write(folder, "trace.csv", "\n".join(lines) + "\n")
    return folder, set()


GIT_ENV = {
    "GIT_AUTHOR_NAME": "cbbench-scenarios",
    "GIT_AUTHOR_EMAIL": "scenarios@cbbench.local",
    "GIT_COMMITTER_NAME": "cbbench-scenarios",
    "GIT_COMMITTER_EMAIL": "scenarios@cbbench.local",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+00:00",
}


def setup_repo(folder: Path, ctx: Context) -> tuple[Path, set[str]]:
    """A scratch git repository of the cbbench source tree's files (uncommitted ones too), one commit, for `gate`
    to check out its base from and run its head in."""
    repo = folder / "repo"
    repo.mkdir()
    if ctx.source is None:
        return repo, set()
    listed = subprocess.run(
        ["git", "-C", str(ctx.source), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        rel = raw.decode()
        src = ctx.source / rel
        if not rel or not os.path.lexists(src) or (src.is_dir() and not src.is_symlink()):
            continue
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, repo / rel, follow_symlinks=False)
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "scenario"]):
        subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, check=True)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    return repo, {sha.stdout.strip()}


def sc(name: str, command: str, **kw: Any) -> Scenario:
    """A scenario from its command line as typed after `cbbench` (shell quoting)."""
    return Scenario(name, tuple(shlex.split(command)), **kw)


SIM = "--device sim:h200"
ONE = "--batching continuous --peers none"
SHAREGPT = "perf-sim-sharegpt"  # the results that show, compare and report read
REPEATS = "perf-sim-repeats"
SWEEP = "perf-sim-sweep"
GATE_SMALL = (
    f"gate --base HEAD {SIM} --num-prompts 10 --warmup 0 --repeats 2 --confidence 0.8 --min-effect off "
    "--min-effect output_throughput=1.5% --output ../gate/g.csv"
)


def run_scenarios() -> list[Scenario]:
    """The commands that do something. A simulated run's figures are kept to the digit; `unordered`: its runs go
    to a pool of processes (the default on sim:<gpu>), whose record files are numbered as they finish."""
    return [
        sc("cbbench-no-args", ""),
        # --- perf on the simulated H200 (a virtual clock: its figures repeat to the digit)
        sc(SHAREGPT, f"perf {SIM} --num-prompts 20 --quiet --output out/sharegpt.csv", unordered=True),
        sc(
            "perf-sim-random-json",
            f"perf {SIM} --workload random --num-prompts 16 --workload-param input_len_max=512,output_len_max=128 "
            "--batching continuous,static --peers none --format json --quiet --output out/random.csv",
            unordered=True,
        ),
        sc(
            "perf-sim-prefix-markdown-progress",
            "perf --device sim:h100 --workload prefix --num-prompts 12 "
            f"--workload-param num_prefixes=2,prefix_len=128,suffix_len=32,output_len=16 {ONE} --format markdown "
            "--steady-state --output out/prefix.csv",
        ),
        sc(
            "perf-sim-trace-file",
            f"perf {SIM} --workload trace --dataset-path trace.csv --time-scale 2 {ONE} --quiet --output out/trace.csv",
            setup=setup_trace,
        ),
        sc(
            SWEEP,
            f"perf {SIM} --num-prompts 16 {ONE} --max-num-batched-tokens 512,2048 --request-rate 8,inf "
            "--executor serial --output out/sweep.csv",
        ),
        sc(REPEATS, f"perf {SIM} --num-prompts 8 {ONE} --repeats 4 --quiet --output out/repeats.csv", unordered=True),
        sc("perf-sim-default-output", f"perf {SIM} --num-prompts 8 {ONE} --label default --quiet"),
        sc(
            "perf-sim-like",
            "perf --like in/out/repeats.csv --quiet --output out/like.csv",
            needs=REPEATS,
            unordered=True,
        ),
        sc(
            "perf-sim-resume-complete",
            f"perf {SIM} --num-prompts 8 {ONE} --repeats 4 --quiet --output in/out/repeats.csv --resume",
            needs=REPEATS,
        ),
        sc("perf-dry-run", f"perf {SIM} --max-num-seqs 64,256 --request-rate 4,inf --dry-run"),
        # --- plan
        sc(
            "plan-sim",
            "plan --num-prompts 20 --max-num-seqs 64,256 --max-num-batched-tokens 2048 --tensor-parallel-size 1 "
            "--batching continuous --slo-ttft-p99-ms 500 --slo-tpot-p99-ms 6 --quiet --output plan/p.csv",
            unordered=True,
        ),
        sc("plan-dry-run", "plan --slo-ttft-p99-ms 200 --dry-run"),
        # --- show, compare, report, plot of the runs above
        sc("show-text", "show in/out/sharegpt.csv", needs=SHAREGPT),
        sc("show-markdown", "show in/out/sharegpt.csv --format markdown", needs=SHAREGPT),
        sc("show-json-steady", "show in/out/sharegpt.csv --format json --steady-state", needs=SHAREGPT),
        sc("compare-same", "compare in/out/sharegpt.csv in/out/sharegpt.csv", needs=SHAREGPT),
        sc("compare-same-json", "compare in/out/sharegpt.csv in/out/sharegpt.csv --format json", needs=SHAREGPT),
        sc("compare-regressed", "compare in/out/sharegpt.csv slower.csv", needs=SHAREGPT, setup=setup_regressed),
        sc(
            "compare-regressed-markdown-where",
            "compare in/out/sharegpt.csv slower.csv --format markdown --where batching=continuous",
            needs=SHAREGPT,
            setup=setup_regressed,
        ),
        sc(
            "compare-spread-inconclusive",
            "compare in/out/repeats.csv spread.csv --tolerance '*=off' --tolerance output_throughput=2%",
            needs=REPEATS,
            setup=setup_spread,
        ),
        sc("report-html", "report in/out/sharegpt.json --out report/r.html", needs=SHAREGPT),
        sc("plot-sweep", "plot in/out/sweep.csv --kind sweep --out .", needs=SWEEP),
        sc("plot-latency", "plot in/out/sweep.csv --kind latency --out plots/lat.png", needs=SWEEP),
        # --- gate on the simulated H200: base HEAD of a scratch copy of the source tree against its work tree,
        # the fewest runs the gate takes (one test at 80 %)
        sc("gate-sim", GATE_SMALL, setup=setup_repo),
        sc("gate-dry-run", f"gate --base HEAD {SIM} --dry-run", setup=setup_repo),
        # --- the simulator's validation, one row
        sc("sim-validate-one", "sim validate --limit 1 --rounds 1 --workers 1 --output sv/sv.csv --markdown sv/sv.md"),
        # --- a real (tiny, random-weight) model on the CPU: its timings masked, its structure kept
        sc(
            "perf-cpu-tiny",
            "perf --model tiny-qwen2 --num-prompts 2 --batching continuous,static --peers none --repeats 1 --warmup 0 "
            "--quiet --output cpu/c.csv",
            timed=True,
        ),
        sc("generate-tiny", "generate 'Hello there' 'The capital of France is' --max-tokens 8"),
        sc("timeline-tiny", "timeline --num-requests 4 --max-num-seqs 2 --out tl.png"),
        sc("bench-scheduler-small", "bench-scheduler --running 8,16 --iters 5", timed=True),
        sc("bench-step-stub", "bench-step --stub-model --running 4 --iters 5 --warmup 1", timed=True),
        sc("kernels-cpu-quick", "kernels --allow-cpu --quick --out k/k.csv", timed=True),
    ]


def bad_input_scenarios() -> list[Scenario]:
    """Bad input: the one-line message and the exit code."""
    bad = [
        ("unknown-command", "nosuch"),
        ("perf-unknown-workload", f"perf {SIM} --workload nosuch"),
        ("perf-negative-prompts", f"perf {SIM} --num-prompts -1"),
        ("perf-prompts-not-int", f"perf {SIM} --num-prompts many"),
        ("perf-bad-rate", f"perf {SIM} --request-rate fast"),
        ("perf-unknown-device", "perf --device sim:h999"),
        ("perf-unknown-batching", f"perf {SIM} --batching continuous,bogus"),
        ("perf-negative-knob", f"perf {SIM} --max-num-batched-tokens 512,-5"),
        ("perf-missing-dataset", f"perf {SIM} --dataset-path missing.json"),
        ("perf-bad-goodput", f"perf {SIM} --goodput ttft"),
        ("perf-resume-without-output", f"perf {SIM} --resume"),
        ("perf-like-missing", "perf --like missing.csv"),
        ("perf-like-garbage", "perf --like garbage.csv"),
        ("perf-bad-format", f"perf {SIM} --format yaml"),
        ("perf-unknown-flag", "perf --no-such-flag"),
        ("perf-bad-executor", f"perf {SIM} --executor bogus"),
        ("perf-openai-without-url", "perf --backend openai"),
        ("perf-bad-workload-param", f"perf {SIM} --workload fixed --workload-param input_len"),
        ("perf-priority-preemption-fcfs", f"perf {SIM} --priority-preemption"),
        ("perf-custom-bad-line", f"perf {SIM} --workload custom --dataset-path prompts.jsonl"),
        ("perf-zero-concurrency", f"perf {SIM} --max-concurrency 0"),
        ("plan-no-slo", "plan"),
        ("plan-negative-slo", "plan --slo-ttft-p99-ms -5"),
        ("plan-pool-on-cpu", "plan --device cpu --slo-ttft-p99-ms 200 --executor pool"),
        ("gate-too-few-repeats", f"gate --base HEAD {SIM} --repeats 2"),
        ("gate-not-a-repo", f"gate --base main {SIM}"),
        ("gate-url-and-tree", "gate --base main --head-url http://127.0.0.1:9"),
        ("gate-bad-min-effect", f"gate --base HEAD {SIM} --min-effect ttft=abc"),
        ("gate-bad-on-inconclusive", f"gate --base HEAD {SIM} --on-inconclusive maybe"),
        ("compare-missing", "compare missing.csv garbage.csv"),
        ("compare-garbage", "compare garbage.csv garbage.csv"),
        ("compare-empty", "compare empty.csv empty.csv"),
        ("compare-bad-tolerance", "compare garbage.csv garbage.csv --tolerance foo"),
        ("show-missing", "show missing.csv"),
        ("show-garbage", "show garbage.csv"),
        ("report-bad-json", "report bad.json"),
        ("plot-missing", "plot missing.csv"),
        ("serve-bad-port", "serve --port 70000"),
    ]
    return [sc("bad-" + name, command, setup=setup_bad_files) for name, command in bad] + [
        sc("bad-show-format", "show in/out/sharegpt.csv --format yaml", needs=SHAREGPT),
        sc(
            "bad-compare-nothing-in-common",
            "compare in/out/sharegpt.csv in/out/sharegpt.csv --where batching=nosuch",
            needs=SHAREGPT,
        ),
        sc("bad-perf-like-two-workloads", "perf --like in/out/sweep.csv --dry-run", needs=SWEEP),
    ]


def scenarios() -> list[Scenario]:
    return help_scenarios() + run_scenarios() + bad_input_scenarios()


# --- recording ------------------------------------------------------------------------------------------------------

DROPPED_ENV = re.compile(
    r"^(COLUMNS|LINES|FORCE_COLOR|NO_COLOR|CLICOLOR|CLICOLOR_FORCE|PY_COLORS|TTY_COMPATIBLE|TTY_INTERACTIVE|DISPLAY"
    r"|WAYLAND_DISPLAY|PYTHONPATH|CI|GITHUB_.*|CBBENCH_.*|VLLM_.*|OLDPWD|PWD)$"
)


def scenario_env(extra: Iterable[tuple[str, str]], tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not DROPPED_ENV.match(k)}
    env.update(TERM="dumb", TZ="UTC", LC_ALL="C.UTF-8", LANG="C.UTF-8", PYTHONHASHSEED="0", TMPDIR=str(tmp))
    env.update(dict(extra))
    return env


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in folder.rglob("*"):
        parts = p.relative_to(folder).parts
        if p.is_file() and not p.is_symlink() and ".git" not in parts and "__pycache__" not in parts:
            st = p.stat()
            out[p.relative_to(folder).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def run_one(sc: Scenario, ctx: Context, done: dict[str, Path]) -> tuple[str, Path, float]:
    """Run `sc` in a folder of its own; returns its record, the folder it ran in and its wall seconds (said on
    stderr, never recorded)."""
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix=f"{sc.name}-", dir=ctx.scratch))
    work, tmp = root / "work", root / "tmp"
    tmp.mkdir()
    if sc.needs:
        shutil.copytree(done[sc.needs], work / "in", symlinks=True)
    else:
        work.mkdir()
    cwd, shas = work, set()
    if sc.setup:
        cwd, shas = sc.setup(work, ctx)
    before = snapshot(work)
    argv = [str(ctx.cbbench), *sc.args]
    try:
        res = subprocess.run(
            argv,
            cwd=cwd,
            env=scenario_env(sc.env, tmp),
            capture_output=True,
            timeout=sc.timeout,
            stdin=subprocess.DEVNULL,
        )
        code, stdout, stderr = str(res.returncode), res.stdout, res.stderr
    except subprocess.TimeoutExpired as e:
        code, stdout, stderr = f"timed out after {sc.timeout:.0f} s", e.stdout or b"", e.stderr or b""
    after = snapshot(work)
    masks = Masks(literals=literals(root, ctx), shas=ctx.shas | shas, timed=sc.timed, unordered=sc.unordered)
    lines = [
        "$ " + " ".join(["cbbench", *sc.args]),
        "cwd: " + masks.text(str(cwd)),
        "env: " + " ".join(f"{k}={v}" for k, v in sc.env),
        f"timed: {sc.timed}",
        "== exit code",
        code,
        "== stdout",
        masks.text(stdout.decode(errors="replace")).rstrip("\n"),
        "== stderr",
        masks.text(stderr.decode(errors="replace")).rstrip("\n"),
    ]
    names = shown_names([p for p in after if before.get(p) != after[p]], work, sc.unordered)
    written = sorted(names, key=lambda p: names[p])
    lines.append(f"== files written ({len(written)})")
    lines += ["  " + masks.text(names[p]) for p in written]
    for rel in written:
        lines.append("== file " + masks.text(names[rel]))
        try:
            lines.append(render_file(work / rel, masks).rstrip("\n"))
        except Exception as e:  # noqa: BLE001 - a file this script cannot read is recorded as such
            lines.append(f"(unreadable: {type(e).__name__})")
    return "\n".join(lines) + "\n", work, time.monotonic() - t0


def shown_names(paths: list[str], work: Path, unordered: bool) -> dict[str, str]:
    """Each written file's name as recorded: its path, except that with `unordered` (runs on a pool of processes,
    numbered as they finish) a run's record files are named by the run's label instead of its number."""
    names = {p: p for p in paths}
    if not unordered:
        return names
    labels = {}
    for p in paths:
        m = RUN_FILE.match(p)
        if m and m["kind"] == "runs":
            try:
                labels[(m["folder"], m["n"])] = str(json.loads((work / p).read_text())["label"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
    for p in paths:
        m = RUN_FILE.match(p)
        label = labels.get((m["folder"], m["n"])) if m else None
        if m and label:
            names[p] = f"{m['folder']}/{m['kind']}/run-<{label}>.{m['ext']}"
    return names


def literals(root: Path, ctx: Context) -> dict[str, str]:
    out = {str(root): "<scenario>", str(root.resolve()): "<scenario>", str(ctx.scratch): "<scratch>"}
    out[str(root / "tmp")] = out[str(root.resolve() / "tmp")] = "<tmpdir>"
    if ctx.source is not None:
        out[str(ctx.source)] = "<src>"
    out[str(ctx.cbbench.parent.parent)] = "<venv>"
    home = str(Path.home())
    if len(home) > 1:
        out.setdefault(home, "<home>")
    host = socket.gethostname()
    if len(host) >= 4:
        out[host] = "<host>"
    return out


def python_of(cbbench: Path) -> Path | None:
    """The interpreter an entry-point script runs (its #! line), else None."""
    try:
        first = cbbench.read_bytes().split(b"\n", 1)[0]
    except OSError:
        return None
    if first.startswith(b"#!"):
        path = Path(first[2:].decode().strip().split()[0])
        return path if path.exists() else None
    return None


def source_tree(python: Path | None) -> Path | None:
    """The git work tree the cbbench package imports from (an editable install), else None."""
    if python is None:
        return None
    probe = "import cbbench, pathlib; print(pathlib.Path(cbbench.__file__).resolve().parent)"
    res = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    top = subprocess.run(
        ["git", "-C", res.stdout.strip(), "rev-parse", "--show-toplevel"], capture_output=True, text=True
    )
    return Path(top.stdout.strip()) if top.returncode == 0 else None


def record(outdir: Path, cbbench: Path, jobs: int, only: str | None) -> int:
    cbbench = cbbench.absolute()
    if not cbbench.exists():
        print(f"user_scenarios: no cbbench at {cbbench}", file=sys.stderr)
        return 2
    python = python_of(cbbench)
    source = source_tree(python)
    shas = set()
    if source is not None:
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True)
        shas.add(head.stdout.strip())
    chosen = [s for s in scenarios() if only is None or only in s.name]
    wanted = {s.name for s in chosen}
    by_name = {s.name: s for s in scenarios()}
    for s in list(chosen):  # what the chosen ones need runs too
        if s.needs and s.needs not in wanted:
            chosen.insert(0, by_name[s.needs])
            wanted.add(s.needs)
    if outdir.is_dir() and any(outdir.iterdir()) and not (outdir / "index.txt").exists():
        print(f"user_scenarios: {outdir} is not empty and holds no recording; name a new folder", file=sys.stderr)
        return 2
    outdir.mkdir(parents=True, exist_ok=True)
    for old in outdir.glob("*.txt"):  # (a recording is one run: the old one's records go)
        old.unlink()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cbscen-") as scratch:
        ctx = Context(cbbench=cbbench, python=python, source=source, shas=shas, scratch=Path(scratch))
        done: dict[str, Path] = {}
        waves = [[s for s in chosen if not s.needs], [s for s in chosen if s.needs]]
        for wave in waves:
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                futures = {pool.submit(run_one, s, ctx, done): s for s in wave}
                for fut in concurrent.futures.as_completed(futures):
                    sc = futures[fut]
                    text, work, took = fut.result()
                    done[sc.name] = work
                    (outdir / f"{sc.name}.txt").write_text(text)
                    code = text.split("== exit code\n", 1)[1].split("\n", 1)[0]
                    print(
                        f"[{len(done)}/{len(chosen)}] {sc.name}: exit {code} ({took:.1f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
    (outdir / "index.txt").write_text("".join(f"{s.name}\n" for s in scenarios() if s.name in wanted))
    print(f"recorded {len(chosen)} scenario(s) in {outdir} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


# --- diff -----------------------------------------------------------------------------------------------------------


def diff_texts(name: str, a: str | None, b: str | None, label_a: str, label_b: str) -> str:
    """A unified diff of one scenario's two records ('' when they are the same)."""
    if a == b:
        return ""
    if a is None or b is None:
        return f"=== {name}: only in {label_b if a is None else label_a}\n"
    lines = difflib.unified_diff(
        a.splitlines(keepends=True), b.splitlines(keepends=True), f"{label_a}/{name}", f"{label_b}/{name}"
    )
    return f"=== {name}\n" + "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def read_records(folder: Path) -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(folder.glob("*.txt")) if p.name != "index.txt"}


def diff(dir_a: Path, dir_b: Path) -> int:
    for d in (dir_a, dir_b):
        if not (d / "index.txt").exists():
            print(f"user_scenarios: {d} holds no recording (no index.txt)", file=sys.stderr)
            return 2
    a, b = read_records(dir_a), read_records(dir_b)
    names = sorted(set(a) | set(b))
    out = [diff_texts(n, a.get(n), b.get(n), str(dir_a), str(dir_b)) for n in names]
    differing = [n for n, d in zip(names, out) if d]
    sys.stdout.write("".join(out))
    if differing:
        print(f"{len(differing)} of {len(names)} scenario(s) differ: {', '.join(differing)}")
        return 1
    print(f"identical: {len(names)} scenario(s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run every scenario and write OUTDIR/NAME.txt")
    rec.add_argument("outdir", type=Path)
    rec.add_argument("--cbbench", type=Path, default=Path(sys.executable).parent / "cbbench")
    rec.add_argument("--jobs", type=int, default=2, help="scenarios run at once (default 2)")
    rec.add_argument("--only", help="only the scenarios whose name holds this (and what they need)")
    dif = sub.add_parser("diff", help="exit 0 when two recordings are the same, 1 with their differences")
    dif.add_argument("dir_a", type=Path)
    dif.add_argument("dir_b", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "record":
        return record(args.outdir, args.cbbench, args.jobs, args.only)
    return diff(args.dir_a, args.dir_b)


if __name__ == "__main__":
    sys.exit(main())
