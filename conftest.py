"""What every test of the checkout shares (conformance/, perf/tests/, refengine/tests/): the tests leave the checkout
as they found it.

- Every test runs in a scratch working directory (a session fixture), so that whatever a test writes to a relative
  path (`cbbench perf`'s default `results/`, `cbbench plot`'s PNG beside a relative CSV, ...) lands in pytest's
  temporary folder, not where the user's own results go. A test that reads a file of the repository names it from
  its own `__file__`.
- pytest-benchmark keeps its storage in the system's temporary folder unless `--benchmark-storage` is given (its
  default, `./.benchmarks`, is made in the working directory when the plugin starts, used or not).
- A guard fails the run (exit 1, the paths listed under the summary) when the checkout holds a file or folder at the
  end that it did not hold at the start, or a file whose size or modification time changed, or lost one. It snapshots
  the tree in the process that runs the session (pytest-xdist's controller under `-n`), so it sees what every
  worker did. Caches of the tools (`__pycache__`, `.hypothesis`, `.pytest_cache`, ...), virtual environments and
  `.git` are left out; so is `--basetemp` when it points inside the checkout.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Set
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # perf/tests/test_checkout_guard.py runs this file in a scratch project

ROOT = Path(__file__).resolve().parent
# folders the walk never enters: version control, the tools' own caches (Hypothesis keeps the failing examples it
# replays in .hypothesis/, as __pycache__ keeps bytecode) and the package metadata `pip install -e` writes
SKIPPED_DIRS = {".git", "__pycache__", ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
SKIPPED_SUFFIXES = (".egg-info",)
BENCHMARK_STORAGE_DEFAULT = "file://./.benchmarks"  # pytest-benchmark's default for --benchmark-storage
Snapshot = dict[str, tuple[int, int]]  # path relative to the checkout -> (size, mtime_ns); folders: (-1, 0)
_CHANGED_KEY = pytest.StashKey[list[str]]()
_SNAPSHOT_KEY = pytest.StashKey[Snapshot]()


def _skipped(path: Path, extra: Set[Path]) -> bool:
    name = path.name
    return (
        name in SKIPPED_DIRS
        or name.endswith(SKIPPED_SUFFIXES)
        or path in extra
        or (path / "pyvenv.cfg").is_file()  # a virtual environment, whatever its name (.venv, .venv-ci, ...)
    )


def snapshot(root: Path, skip: Set[Path] = frozenset()) -> Snapshot:
    """Every file and folder under `root` (less the skipped ones) with its size and modification time."""
    out: Snapshot = {}
    for top, dirs, files in os.walk(root):
        here = Path(top)
        dirs[:] = [d for d in dirs if not _skipped(here / d, skip)]
        for d in dirs:
            out[(here / d).relative_to(root).as_posix() + "/"] = (-1, 0)
        for f in files:
            try:
                st = (here / f).lstat()
            except FileNotFoundError:  # gone between the listing and the stat
                continue
            out[(here / f).relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """The paths written, changed or removed between two snapshots, each with what happened to it."""
    out = [f"new      {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"changed  {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    out += [f"removed  {p}" for p in sorted(before.keys() - after.keys())]
    return out


def _inside_checkout(path: Path | None) -> set[Path]:
    if path is None:
        return set()
    path = path.resolve()
    return {path} if path.is_relative_to(ROOT) else set()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    # runs before pytest-benchmark's own pytest_configure (trylast), which makes the storage folder at once
    if getattr(config.option, "benchmark_storage", None) == BENCHMARK_STORAGE_DEFAULT:
        config.option.benchmark_storage = "file://" + str(Path(tempfile.gettempdir()) / "cbbench-pytest-benchmarks")


def _basetemp(config: pytest.Config) -> Path | None:
    given = config.option.basetemp
    return Path(given) if given else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its workers
def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_xdist_worker(session.config):
        session.config.stash[_SNAPSHOT_KEY] = snapshot(ROOT, _inside_checkout(_basetemp(session.config)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    before = config.stash.get(_SNAPSHOT_KEY, None)
    if before is None:
        return
    found = changes(before, snapshot(ROOT, _inside_checkout(_basetemp(config))))
    config.stash[_CHANGED_KEY] = found
    if found and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    found = config.stash.get(_CHANGED_KEY, [])
    if not found:
        return
    terminalreporter.section("tests wrote into the checkout", sep="=", red=True, bold=True)
    terminalreporter.line(
        f"the run changed {len(found)} path(s) under {ROOT}: a test writes under its tmp_path, never into the"
        " checkout (conftest.py; a file edited while the tests ran shows here too):"
    )
    for line in found:
        terminalreporter.line(f"  {line}", red=True)


@pytest.fixture(scope="session", autouse=True)
def _scratch_cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The working directory of every test: a scratch folder, so relative writes never reach the checkout."""
    scratch = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(scratch)
        yield scratch
