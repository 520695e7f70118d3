"""Run the README's examples, so that none can silently stop working.

    python ci/readme_examples.py --list  [--readme README.md]   # every example command, with its line
    python ci/readme_examples.py --check [--readme README.md]   # cheap: plan, parse, or run what is cheap
    python ci/readme_examples.py --full  [--readme README.md]   # every example as written, timed

An example is a line of a ```bash block that starts with cbbench, .venv/bin/cbbench, pytest, .venv/bin/pytest, bash,
python or .venv/bin/python (`a && b` is two; a trailing `# comment` is not part of it). `--check`:
- `cbbench perf ...` runs with `--dry-run` appended (the options parse and the plan builds; nothing is measured);
- `--help`, `compare`, `show`, `report` and `plot` run for real, on results files made once per check (a two-point
  sweep of the tiny model, `--fixtures DIR` to reuse a folder) wherever the example names a placeholder
  (`results/<file>.csv`) or a file the repository does not track (an untracked `prompts.jsonl` that happens to
  lie in the checkout is never read); `compare`'s missing side (the `NEW.csv` a perf example
  would have written) is a copy of its other side; what they write goes to a scratch folder, never the checkout;
- the other cbbench commands (serve, timeline, generate, ...) are parsed by their own command line, not run;
- pytest, bash and python examples must name files and folders that exist.
`--full` runs each one as written from the repository root (`cbbench serve` in the background until the end, so the
examples after it can reach it), prints each one's wall time, and lists those over `--slow-s` (60 s): the README must
say how long they take. Exit 1 when any example fails.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTS = ("cbbench", ".venv/bin/cbbench", "pytest", ".venv/bin/pytest", "bash", "python", ".venv/bin/python")
CHEAP = ("compare", "show", "report", "plot")  # read results files only: run for real by --check
OUTPUT_OPTIONS = ("--output", "-o", "--out")
CHECK_TIMEOUT_S = 600  # one cheap example on a loaded CI machine; a hang must end
SERVER_START_S = 120  # --full: how long `cbbench serve` may take to answer /health
# the sweep that stands in for `results/<file>.csv` (plot needs a sweep): the tiny model, a few tokens
FIXTURE_RUN = (
    "perf --workload fixed --workload-param input_len=8,output_len=4 --num-prompts 4 --warmup 0 --peers none "
    "--batching continuous --max-num-batched-tokens 64,128 --cpu-threads 0 --quiet"
)


@dataclass
class Example:
    line: int  # 1-based line of the README
    argv: list[str]

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


def extract(markdown: str) -> list[Example]:
    """The example commands of ```bash blocks, in order (continuation lines joined)."""
    out: list[Example] = []
    in_bash, pending, start = False, "", 0
    for i, line in enumerate(markdown.splitlines(), start=1):
        if line.strip().startswith("```"):
            in_bash, pending = (line.strip() == "```bash") and not in_bash, ""
            continue
        if not in_bash:
            continue
        start = start if pending else i
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words, pending = shlex.split(pending + line, comments=True), ""
        for part in _split_and(words):
            if part and part[0] in STARTS:
                out.append(Example(start, part))
    return out


def _split_and(words: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for w in words:
        parts.append([]) if w == "&&" else parts[-1].append(w)
    return parts


def cbbench_args(ex: Example) -> list[str] | None:
    """The arguments after `cbbench`, or None when the example is not a cbbench command."""
    return ex.argv[1:] if Path(ex.argv[0]).name == "cbbench" else None


def make_fixtures(folder: Path) -> dict[str, Path]:
    """Results files for the examples to read: a tiny sweep's CSV + JSON, and a custom-workload JSONL."""
    folder.mkdir(parents=True, exist_ok=True)
    csv = folder / "sweep.csv"
    if not csv.exists():
        cmd = [sys.executable, "-m", "cbbench.perf.cli", *shlex.split(FIXTURE_RUN), "--output", str(csv)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"the fixture run failed: {(done.stderr or done.stdout).strip()[-500:]}")
    jsonl = folder / "prompts.jsonl"
    if not jsonl.exists():
        jsonl.write_text(
            "".join(json.dumps({"prompt": f"example prompt {i}", "output_len": 4}) + "\n" for i in range(64))
        )
    return {".csv": csv, ".json": csv.with_suffix(".json"), ".jsonl": jsonl}


def substitute(args: list[str], fixtures: dict[str, Path], scratch: Path) -> list[str]:
    """Placeholders and missing input files become fixtures (a CSV keeps its JSON beside it); outputs go to scratch."""
    out = []
    for i, a in enumerate(args):
        after_output = i > 0 and args[i - 1] in OUTPUT_OPTIONS
        suffix = Path(a).suffix
        if after_output:
            a = str(scratch / Path(a.replace("<", "").replace(">", "")).name)
        elif suffix in fixtures and ("<" in a or not tracked(a)):
            src = fixtures[suffix]
            dst = scratch / ("fixture-" + re.sub(r"[^A-Za-z0-9_.-]", "", Path(a).name))
            shutil.copyfile(src, dst)
            if suffix in (".csv", ".json"):  # a results pair: the CSV, the JSON and the record folder go together
                for kind in (".csv", ".json"):
                    if src.with_suffix(kind).exists():
                        shutil.copyfile(src.with_suffix(kind), dst.with_suffix(kind))
                if src.with_suffix(".records").is_dir():
                    shutil.copytree(src.with_suffix(".records"), dst.with_suffix(".records"), dirs_exist_ok=True)
            a = str(dst)
        out.append(a)
    return out


def tracked(path: str) -> bool:
    """Whether `path` is a file the repository holds (git tracks it): an example reads only those from the checkout,
    never what happens to lie there (a user's own `prompts.jsonl` in the root stands in for nothing)."""
    done = subprocess.run(
        ["git", "ls-files", "--error-unmatch", "--", path], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.returncode == 0


def _run(argv: list[str], timeout_s: float = CHECK_TIMEOUT_S) -> tuple[bool, str]:
    """(exit 0, its first line of output when it passed, else its last line of errors)."""
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    ok = done.returncode == 0
    lines = (done.stdout if ok else done.stderr or done.stdout).strip().splitlines()
    return ok, ((lines[0] if ok else lines[-1]).strip() if lines else f"exit {done.returncode}")


def _parses(args: list[str]) -> tuple[bool, str]:
    """Whether a cbbench command line parses (its command's own options and types), without running it."""
    import typer.main

    from cbbench.perf.cli import app

    group = typer.main.get_command(app)
    try:
        sub = group.commands[args[0]]  # type: ignore[attr-defined]
        sub.make_context(args[0], list(args[1:]))
    except KeyError:
        return False, f"no command {args[0]!r}"
    except Exception as e:  # noqa: BLE001 - click's usage errors and bad values: the example does not parse
        return False, e.format_message() if hasattr(e, "format_message") else str(e)
    return True, "parses"


def check_one(ex: Example, fixtures: dict[str, Path], scratch: Path) -> tuple[bool, str]:
    """What --check does with one example: (passed, what happened)."""
    args = cbbench_args(ex)
    cli = [sys.executable, "-m", "cbbench.perf.cli"]
    if args is not None:
        if not args or "--help" in args:
            return _run([*cli, *args])
        if args[0] == "compare":  # a side no earlier example wrote (perf ran --dry-run) is the other side's copy
            sides = [a for a in args[1:3] if "<" not in a and (ROOT / a).exists()]
            args = [args[0], *(a if a in sides or not sides else sides[0] for a in args[1:3]), *args[3:]]
        args = substitute(args, fixtures, scratch)
        if args[0] == "perf":
            return _run([*cli, *args, "--dry-run"])
        if args[0] in CHEAP:
            return _run([*cli, *args])
        return _parses(args)
    words = ex.argv[1:]
    paths = [
        a
        for i, a in enumerate(words)
        if not a.startswith("-") and ("/" in a or "." in a) and (i == 0 or words[i - 1] not in ("-c", "-m"))
    ]
    missing = [p for p in paths if not (ROOT / p).exists()]
    return (not missing, f"missing: {', '.join(missing)}" if missing else "its files exist")


def _latest(suffix: str) -> Path | None:
    found = sorted((ROOT / "results").glob(f"*{suffix}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _serve(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start `cbbench serve` in the background and wait until it answers /health."""
    import urllib.request

    host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
    port = args[args.index("--port") + 1] if "--port" in args else "8000"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cbbench.perf.cli", *args], cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"cbbench serve did not answer /health within {SERVER_START_S} s (log: {log})")


def full(examples: list[Example], scratch: Path, slow_s: float) -> int:
    """Every example as written, timed; `cbbench serve` stays up in the background until the end."""
    servers: list[subprocess.Popen[bytes]] = []
    failed, slow = 0, []
    try:
        for ex in examples:
            args, t = cbbench_args(ex), time.perf_counter()
            try:
                if args and args[0] == "serve":
                    servers.append(_serve(args, scratch / f"serve-{ex.line}.log"))
                    ok, what = True, "serving in the background"
                else:
                    argv = [_placeholder(a) for a in ex.argv]
                    ok, what = _run(argv, timeout_s=24 * 3600)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                ok, what = False, str(e)
            took = time.perf_counter() - t
            failed += not ok
            slow += [(took, ex)] if took > slow_s else []
            print(f"{took:8.1f} s  line {ex.line}: {ex.text}  {'ok' if ok else 'FAILED'}: {what}", flush=True)
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(timeout=30)
    for took, ex in slow:
        print(f"over {slow_s:g} s ({took:.0f} s): line {ex.line}: {ex.text}")
    return 1 if failed else 0


def _placeholder(arg: str) -> str:
    """`results/<file>.csv` -> the newest results file of that kind (the one the examples before it wrote)."""
    if "<" not in arg:
        return arg
    newest = _latest(Path(arg).suffix)
    return str(newest) if newest is not None else arg


def check(examples: list[Example], fixtures_dir: Path | None, scratch: Path) -> int:
    fixtures = make_fixtures(fixtures_dir or scratch / "fixtures")
    failed = 0
    for ex in examples:
        ok, what = check_one(ex, fixtures, scratch)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} line {ex.line}: {ex.text}  ({what})", flush=True)
    print(f"{len(examples) - failed} of {len(examples)} examples pass")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="print the examples")
    mode.add_argument("--check", action="store_true", help="plan, parse or run the cheap ones")
    mode.add_argument("--full", action="store_true", help="run every example as written, timed")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--fixtures", type=Path, default=None, help="--check: reuse (or make) the results fixtures here")
    ap.add_argument("--slow-s", type=float, default=60.0, help="--full: examples slower than this are listed")
    args = ap.parse_args(argv)
    try:
        examples = extract(args.readme.read_text())
    except (OSError, ValueError) as e:  # a missing file, an unclosed quote
        print(f"readme_examples: error: {args.readme}: {e}", file=sys.stderr)
        return 2
    if args.list:
        for ex in examples:
            print(f"{ex.line}: {ex.text}")
        return 0
    with tempfile.TemporaryDirectory(prefix="readme-examples-") as tmp:
        return check(examples, args.fixtures, Path(tmp)) if args.check else full(examples, Path(tmp), args.slow_s)


if __name__ == "__main__":
    sys.exit(main())
