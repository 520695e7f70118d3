"""Mutation score: plant each bug of conformance/mutants/, one at a time, and see whether the fast suite notices.

    python -m conformance.mutate [--only NAME ...] [--tests FILE ...] [--timeout S] [--markdown PATH]

Never edits the working tree: the tracked (and untracked, not ignored) files are copied once into a temporary
directory, and each mutant patches that copy, runs its subset of the suite there (pytest -x, the default Hypothesis
profile, a per-mutant timeout), and restores the file. The copy is imported first (PYTHONPATH; an editable install's
finder comes after it on sys.meta_path), which is checked before any mutant runs. A mutant is
  killed    the subset failed (or ran past the timeout: a hang it caused);
  survived  the subset passed: the suite misses that bug;
  stale     its snippet is not in the file any more (code refactored): neither, update the snippet;
  unavailable  an adapter's mutant whose engine environment (Mutant.python, e.g. .venv-vllm) is not there: neither.
The unmutated subsets must pass first, or nothing is scored. Exit status: 0 if nothing survived but the mutants argued equivalent (`equivalent=True`), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.mutants import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = 600  # a subset takes well under this on a quiet machine; past it the mutant made something hang


def copy_tree(dest: Path, root: Path = ROOT) -> None:
    """Copy the tracked (and untracked, not ignored) files of `root` into `dest`. A symbolic link is copied as a
    link, with its target as written (`perf -> cbbench/perf`: in the copy it points into the copy), never as a copy
    of what it points to nor skipped as "not a file": git lists a link to a folder as one entry, and nothing under
    it."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    for rel in filter(None, files):
        src, out = root / rel, dest / rel
        if rel.startswith(("results/", "docs/")) or not (src.is_symlink() or src.is_file()):
            continue  # (a file deleted but not yet staged is still listed)
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target = os.readlink(src)
            if os.path.isabs(target) or not Path(os.path.normpath(out.parent / target)).is_relative_to(dest):
                # a mutant patched through it would edit the working tree, or the copy would import it
                raise SystemExit(f"{rel} links outside the repository ({target}): the copy cannot hold it")
            out.symlink_to(target)
        else:
            shutil.copy2(src, out)


def interpreter(m: Mutant, root: Path = ROOT) -> str | None:
    """The Python that runs the mutant's subset: the tool's own, or the engine's environment an adapter's mutant
    names (`Mutant.python`, relative to the repository); None where that environment is not there."""
    if not m.python:
        return sys.executable
    path = root / m.python
    return str(path) if path.exists() else None


def run_tests(
    tree: Path, tests: tuple[str, ...], timeout: float, python: str = sys.executable
) -> tuple[str, float, str]:
    """('pass' | 'fail' | 'timeout', seconds, last lines of the output) of one pytest run inside the copy."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start, ""
    tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-3:])
    return ("pass" if p.returncode == 0 else "fail"), time.monotonic() - start, tail


def check_copy_is_imported(tree: Path, python: str = sys.executable) -> None:
    """Refuse to score unless refengine, conformance and cbbench.perf (where mutants are planted) import from the
    copy (in each interpreter that runs a subset: an engine's environment has its own editable install)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = (
        "import refengine.scheduler.scheduler as s, conformance, cbbench.perf.exceptions as m; "
        "print(s.__file__); print(conformance.__file__); print(m.__file__)"
    )
    found = subprocess.run(
        [python, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    for where in found:
        if not Path(where).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"the copy is not what gets imported ({where}): refusing to score")


def score(mutants: list[Mutant], timeout: float, log=print) -> list[tuple[Mutant, str, float]]:
    """[(mutant, 'killed' | 'survived' | 'stale' | 'unavailable', seconds)] for each mutant, run one at a time in a
    copy ('unavailable': the engine environment its subset needs is not there)."""
    results = []
    pythons = {m.name: interpreter(m) for m in mutants}
    with tempfile.TemporaryDirectory(prefix="cbbench-mutate-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        for python in sorted({p for p in pythons.values() if p is not None}):
            check_copy_is_imported(tree, python)
        for python, tests in sorted({(pythons[m.name], m.tests) for m in mutants if pythons[m.name] is not None}):
            outcome, secs, tail = run_tests(tree, tests, timeout, python)
            where = "" if python == sys.executable else f" ({python})"
            log(f"baseline {' '.join(tests)}{where}: {outcome} in {secs:.0f}s")
            if outcome != "pass":
                raise SystemExit(f"the unmutated subset does not pass; fix it first:\n{tail}")
        for m in mutants:
            python = pythons[m.name]
            if python is None:
                results.append((m, "unavailable", 0.0))
                log(f"{m.name}: unavailable ({m.python} is not there: see docs/mutation.md)")
                continue
            target = tree / m.path
            original = target.read_text()
            if original.count(m.old) != 1:
                results.append((m, "stale", 0.0))
                log(f"{m.name}: stale (snippet found {original.count(m.old)} times in {m.path})")
                continue
            target.write_text(original.replace(m.old, m.new))
            try:
                outcome, secs, tail = run_tests(tree, m.tests, timeout, python)
            finally:
                target.write_text(original)
            verdict = "survived" if outcome == "pass" else "killed"
            results.append((m, verdict, secs))
            log(f"{m.name}: {verdict} ({outcome}, {secs:.0f}s) {tail.splitlines()[-1] if tail else ''}")
    return results


def markdown(results: list[tuple[Mutant, str, float]]) -> str:
    scored = [r for r in results if r[1] not in ("stale", "unavailable")]
    killed = sum(r[1] == "killed" for r in scored)
    equivalent = sum(r[1] == "survived" and r[0].equivalent for r in scored)
    stale = sum(r[1] == "stale" for r in results)
    unavailable = sum(r[1] == "unavailable" for r in results)
    lines = [
        f"Score: {killed}/{len(scored)} killed, {equivalent} argued equivalent ({stale} stale, {unavailable} "
        "unavailable: the engine environment their subset needs is not there).",
        "",
        "| mutant | file | bug | result | seconds |",
        "|---|---|---|---|---|",
    ]
    for m, verdict, secs in results:
        shown = f"{verdict} (argued equivalent)" if m.equivalent and verdict == "survived" else verdict
        lines.append(f"| `{m.name}` | {m.path} | {m.what} | {shown} | {secs:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.mutate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="mutant names (default: all)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per mutant's test run")
    ap.add_argument(
        "--tests",
        nargs="*",
        default=None,
        help="run these test files for every chosen mutant instead of each mutant's own subset",
    )
    ap.add_argument("--markdown", type=Path, default=None, help="write the score table here")
    args = ap.parse_args(argv)
    names = {m.name for m in MUTANTS}
    unknown = set(args.only or []) - names
    if unknown:
        print(f"--only: unknown mutant(s) {sorted(unknown)}", file=sys.stderr)
        return 2
    chosen = [m for m in MUTANTS if args.only is None or m.name in args.only]
    if args.tests:
        chosen = [dataclasses.replace(m, tests=tuple(args.tests)) for m in chosen]
    # killed (a CI timeout): unwind, so that the running pytest is killed and the temporary copy removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = score(chosen, args.timeout, log=lambda s: print(s, flush=True))
    table = markdown(results)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return exit_status(results)


def exit_status(results: list[tuple[Mutant, str, float]]) -> int:
    """1 if a mutant survived that is not argued equivalent (docs/mutation.md), else 0."""
    return 1 if any(v == "survived" and not m.equivalent for m, v, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
