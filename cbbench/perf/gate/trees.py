"""The two trees a gate runs: the work tree as it is, or a revision checked out once as a detached `git worktree` in
a temporary folder, and how a process imports `cbbench` and `refengine` from exactly that tree.

Every tree shares the running interpreter and its installed dependencies (one torch, no pip install): a run of a
tree is `sys.executable -m cbbench.perf.cli ...` with PYTHONPATH naming the tree first. The editable install's
finder sits at the end of `sys.meta_path`, so a path on PYTHONPATH wins over it. Two layouts exist:
- a tree with `cbbench/__init__.py` (the package on disk): its root on PYTHONPATH is enough;
- a tree whose `kernels/`, `perf/` and `workloads/` become `cbbench.*` only through setup.py's package_dir (no
  `cbbench/` folder): a small link folder spells the import names (`cbbench/{kernels,perf,workloads}` and
  `refengine` link into the tree, `cbbench/__init__.py` makes it a regular package, so no other `cbbench` on the
  path can lend it a module), as ci/typecheck.sh does for mypy.
`check_imports` asks a fresh interpreter where the names resolve, so an arm never runs another tree's code unseen.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cbbench.perf.gate.signals import deferred

NAMESPACED = ("kernels", "perf", "workloads")  # setup.py's folders that install as cbbench.<folder>
WORK_TREE = "work tree"
GIT_TIMEOUT_S = 120  # a checkout of a large tree on a slow disk; no git command here talks to a network


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
    )


def repo_root(cwd: str | os.PathLike[str] | None = None) -> Path:
    """The top of the git work tree that holds `cwd` (ValueError when there is none)."""
    where = Path(cwd or os.getcwd())
    try:
        res = _git(where, "rev-parse", "--show-toplevel")
    except OSError as e:
        raise ValueError(f"gate: git is needed to check out a revision ({e.strerror})") from None
    if res.returncode != 0:
        raise ValueError(f"gate: {where} is not inside a git repository (--base REV names a commit of one)")
    return Path(res.stdout.strip())


def resolve(repo: Path, rev: str, option: str) -> str:
    """The commit `rev` names, as a full sha (ValueError naming the option when there is none)."""
    if not rev.strip() or rev.startswith("-") or any(c in rev for c in "\n\r\x00"):
        raise ValueError(f"{option} {rev!r}: not a revision")
    res = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if res.returncode != 0 or not res.stdout.strip():
        hint = ""
        if _git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
            hint = " (a shallow clone: fetch its history first, e.g. git fetch --unshallow, or fetch-depth: 0 in CI)"
        raise ValueError(f"{option} {rev}: no such revision in {repo}{hint}")
    return res.stdout.strip()


def head_sha(repo: Path) -> str:
    return resolve(repo, "HEAD", "HEAD")


def dirty(repo: Path) -> bool:
    """Uncommitted changes to tracked files (what a run's `git_sha` marks `-dirty`)."""
    return bool(_git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip())


@dataclass(frozen=True)
class Tree:
    """One arm's code: `rev` as the user named it (or "work tree"), the commit it is, and where it lies on disk."""

    arm: str  # "base" | "head"
    rev: str
    sha: str
    root: Path
    checked_out: bool  # a worktree this gate made (and removes)
    dirty: bool = False  # the work tree with uncommitted changes (its runs' git_sha end in -dirty)

    @property
    def name(self) -> str:
        """`main (1a2b3c4)`, `work tree (1a2b3c4-dirty)`: how tables and messages name the tree."""
        short = f"{self.sha[:7]}{'-dirty' if self.dirty else ''}"
        return short if self.sha.startswith(self.rev) else f"{self.rev} ({short})"  # (a sha is named once)

    def ran_this(self, git_sha: str) -> bool:
        """Whether a row's `git_sha` (written by the tree's own code) is this tree's ("unknown" cannot be told)."""
        if git_sha in ("", "unknown"):
            return True
        return git_sha.removesuffix("-dirty") == self.sha


def work_tree(repo: Path, arm: str) -> Tree:
    return Tree(arm, WORK_TREE, head_sha(repo), repo, checked_out=False, dirty=dirty(repo))


def _git_uninterrupted(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`git` in a session of its own, waited for even when the gate is interrupted meanwhile: a `git worktree add`
    killed halfway leaves a registered (and locked) worktree that `git worktree prune` keeps, so the command is let
    finish (it takes seconds) and the caller removes what it made. The interrupt goes on after it."""
    proc = subprocess.Popen(
        ["git", "-C", str(repo), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (a Ctrl-C at the terminal reaches the gate, not git)
    )
    try:
        out, err = proc.communicate(timeout=GIT_TIMEOUT_S)
    except BaseException:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=GIT_TIMEOUT_S)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def check_out(repo: Path, arm: str, rev: str, sha: str, folder: Path) -> Tree:
    """`sha` as a detached worktree at `folder` (removed by `remove`, which the caller must call whether or not this
    returns: an interrupt may come while git makes it)."""
    res = _git_uninterrupted(repo, "worktree", "add", "--detach", "--quiet", str(folder), sha)
    if res.returncode != 0:
        line = (res.stderr.strip().splitlines() or ["git worktree add failed"])[-1]
        raise ValueError(f"gate: cannot check out {rev} ({sha[:7]}) for the {arm} arm: {line}")
    return Tree(arm, rev, sha, folder, checked_out=True)


def planned(arm: str, rev: str, sha: str, folder: Path) -> Tree:
    """The worktree `check_out` is about to make, to register for removal before git starts."""
    return Tree(arm, rev, sha, folder, checked_out=True)


def _admin_entries(repo: Path, folder: Path) -> list[Path]:
    """The repository's worktree entries (.git/worktrees/<id>) that point at `folder`: this gate's own, and no other."""
    res = _git(repo, "rev-parse", "--git-common-dir")
    common = Path(res.stdout.strip()) if res.returncode == 0 else repo / ".git"
    if not common.is_absolute():
        common = repo / common
    out = []
    target = os.path.realpath(folder / ".git")
    for entry in sorted((common / "worktrees").glob("*")) if (common / "worktrees").is_dir() else []:
        with contextlib.suppress(OSError):
            if os.path.realpath((entry / "gitdir").read_text().strip()) == target:
                out.append(entry)
    return out


def remove(repo: Path, tree: Tree) -> None:
    """Remove a worktree this gate made (or began to make), and its entry in the repository, locked or not; no other
    worktree's entry is touched (no prune)."""
    if not tree.checked_out:
        return
    _git(repo, "worktree", "remove", "--force", "--force", str(tree.root))  # (twice: a locked one too)
    shutil.rmtree(tree.root, ignore_errors=True)
    for entry in _admin_entries(repo, tree.root):
        shutil.rmtree(entry, ignore_errors=True)


def layout(root: Path) -> str:
    """ "package" (cbbench/__init__.py on disk) or "mapped" (setup.py's package_dir); ValueError for neither."""
    if (root / "cbbench" / "__init__.py").is_file():
        return "package"
    if all((root / f).is_dir() for f in (*NAMESPACED, "refengine")):
        return "mapped"
    raise ValueError(f"gate: {root} holds no cbbench (neither cbbench/__init__.py nor kernels/, perf/, workloads/)")


def import_root(tree: Tree, scratch: Path) -> Path:
    """The folder to put first on PYTHONPATH so that `cbbench` and `refengine` import from `tree`."""
    if layout(tree.root) == "package":
        return tree.root
    links = scratch / f"imports-{tree.arm}"
    shutil.rmtree(links, ignore_errors=True)
    (links / "cbbench").mkdir(parents=True)
    (links / "cbbench" / "__init__.py").write_text('"""cbbench of one gate arm: links into its tree."""\n')
    for folder in NAMESPACED:
        (links / "cbbench" / folder).symlink_to(tree.root / folder, target_is_directory=True)
    (links / "refengine").symlink_to(tree.root / "refengine", target_is_directory=True)
    return links


def arm_environment(path: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process of one arm: `path` first on PYTHONPATH, the rest of the caller's after it, and
    bytecode written (PYTHONDONTWRITEBYTECODE unset: with it, every run would compile its tree again, while a tree
    with a warm __pycache__ would not; the CPU seconds of the arms' runs would differ for that alone)."""
    env = dict(os.environ if base is None else base)
    rest = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(path) + (os.pathsep + rest if rest else "")
    env.pop("PYTHONSAFEPATH", None)  # (the run's cwd is its tree's root: the same code either way)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def compile_tree(tree: Tree) -> None:
    """Compile every module of `tree` into its __pycache__ folders before any run (a new worktree has none), so that
    no measured run pays a compile that another does not."""
    folders = ["cbbench", "refengine"] if layout(tree.root) == "package" else [*NAMESPACED, "refengine"]
    argv = [sys.executable, "-m", "compileall", "-q", "-x", "/tests/", *folders]
    subprocess.run(argv, cwd=tree.root, capture_output=True, timeout=600, check=False)


_PROBE = (
    "import importlib.util, json, sys\n"
    "out = {}\n"
    "for name in ('cbbench.perf.cli', 'refengine'):\n"
    "    spec = importlib.util.find_spec(name)\n"
    "    out[name] = spec.origin if spec is not None else None\n"
    "print(json.dumps(out))\n"
)


def check_imports(tree: Tree, env: dict[str, str]) -> None:
    """ValueError unless a fresh interpreter with `env` (and cwd at the tree's root, as its runs have) imports
    cbbench.perf and refengine from `tree`."""
    res = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=tree.root, env=env, capture_output=True, text=True, timeout=120
    )
    try:
        found = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        line = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"gate: the {tree.arm} arm ({tree.name}) cannot import cbbench: {line}") from None
    root = tree.root.resolve()
    for name, origin in found.items():
        where = Path(origin).resolve() if origin else None
        if where is None or not where.is_relative_to(root):
            raise ValueError(f"gate: the {tree.arm} arm imports {name} from {origin}, not from its tree {root}")


@contextlib.contextmanager
def scratch_folder(prefix: str = "cbbench-gate-") -> Iterator[Path]:
    """A temporary folder for the worktrees, link folders and runs, removed on the way out (errors and Ctrl-C too)."""

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        with deferred():  # (a signal now would leave the folder half removed)
            shutil.rmtree(folder, ignore_errors=True)
