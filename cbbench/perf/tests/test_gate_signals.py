"""A gate ended by a signal at any phase cleans up: no registered or locked worktree, no scratch folder, no process
of its runs left, the reserved output released (no run had finished), and the exit code 128 + the signal's number.
The phases: while `git worktree add` makes the base's checkout (a `git` on PATH that is slow there, as a large tree
on a slow disk is), while an arm's `perf --dry-run` reads the options, and while a measured run runs."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from gate_repos import copy_of_this_checkout, git

from refengine.tests.waiting import HangGuard, wait_for

SIM = ["--device", "sim:h200", "--num-prompts", "64", "--repeats", "5", "--quiet"]
SLOW_GIT_S = 2  # how long the shim's `git worktree add` takes after the real one: a signal lands inside

PHASES = {  # phase -> the file whose appearance says the gate is in it
    "worktree add": "git-worktree-add-started",
    "preflight": "cbbench-gate-*/preflight/*.err",
    "run": "cbbench-gate-*/runs/*.err",
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_this_checkout(tmp_path_factory.mktemp("gate-signals") / "repo")


def _slow_git(folder: Path, marker: Path) -> Path:
    """A `git` whose `worktree add` takes SLOW_GIT_S more after the real one (and is the real git otherwise)."""
    real = subprocess.run(["which", "git"], capture_output=True, text=True, check=True).stdout.strip()
    shim = folder / "git"
    shim.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" worktree add "*)\n'
        f'  touch "{marker}"; "{real}" "$@"; rc=$?; sleep {SLOW_GIT_S}; exit $rc;;\n'
        "esac\n"
        f'exec "{real}" "$@"\n'
    )
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return folder


def _signalled_gate(repo: Path, tmp: Path, phase: str, signum: int) -> tuple[int, str]:
    scratch = tmp / "tmp"
    scratch.mkdir()
    shims = _slow_git(tmp, scratch / PHASES["worktree add"])
    env = {**os.environ, "TMPDIR": str(scratch), "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    argv = [sys.executable, "-m", "cbbench.perf.cli", "gate", "--base", "HEAD", "--output", str(tmp / "g.csv"), *SIM]
    proc = subprocess.Popen(argv, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: list(scratch.glob(PHASES[phase])) or proc.poll() is not None, f"the gate reaching {phase}")
    assert list(scratch.glob(PHASES[phase])), f"the gate never reached {phase}: {proc.communicate()}"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    left = [p for p in scratch.iterdir() if p.name != PHASES["worktree add"]]
    assert left == [], f"left in the scratch folder: {left}"
    assert git(repo, "worktree", "list").count("\n") == 0, git(repo, "worktree", "list")  # only the repo itself
    admin = repo / ".git" / "worktrees"
    assert not admin.exists() or list(admin.iterdir()) == []  # no entry, locked or not, that prune would keep
    assert not (tmp / "g.csv").exists() and not (tmp / "g.records").exists()
    return proc.returncode, err.decode(errors="replace")


def _processes_of(repo: Path) -> list[str]:
    """The gate's processes still there, once those just killed have had time to go: a killed process leaves /proc
    when the kernel has torn it down, not at once, and later on a loaded machine; one still there after the hang
    guard was never killed."""
    with contextlib.suppress(HangGuard):
        wait_for(lambda: not _naming(repo), "the gate's processes leaving")
    return _naming(repo)


def _naming(repo: Path) -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().decode(errors="replace")
                if "cbbench-gate-" in cmd and str(repo.parent) in cmd:
                    out.append(cmd)
            except OSError:
                continue
    return out


def test_sigterm_while_git_makes_the_worktree_leaves_none(repo: Path, tmp_path: Path) -> None:
    code, err = _signalled_gate(repo, tmp_path, "worktree add", signal.SIGTERM)
    assert code == 128 + signal.SIGTERM and "interrupted (SIGTERM)" in err, err


@pytest.mark.slow  # a gate up to each phase per signal: about a minute on a shared CPU
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("phase", list(PHASES))
def test_every_signal_at_every_phase_cleans_up(repo: Path, tmp_path: Path, phase: str, signum: int) -> None:
    code, err = _signalled_gate(repo, tmp_path, phase, signum)
    assert code == 128 + signum, err
    assert _processes_of(repo) == []
